// TensorView: a non-owning view of someone else's memory (pointer, dtype, device, shape,
// strides in elements). Checks return nothing and throw attnkit::Error on violation.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "attnkit/dtype.h"

namespace attnkit {

enum class Device : uint8_t { CPU, CUDA };
std::string_view device_name(Device d);

struct TensorView {
  static constexpr int kMaxDims = 6;

  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::CPU;
  int device_index = 0;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements

  TensorView() = default;
  // Contiguous (row-major) view.
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape,
             Device device = Device::CPU, int device_index = 0);
  // Explicit strides (same length as shape).
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape,
             std::initializer_list<int64_t> strides, Device device = Device::CPU,
             int device_index = 0);

  bool defined() const { return data != nullptr; }
  int64_t size(int d) const;    // negative d counts from the end
  int64_t stride(int d) const;  // negative d counts from the end
  int64_t numel() const;
  bool is_contiguous() const;
  std::string shape_str() const;  // "[4, 32, 128]"
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }

  // ---- checks (throw Error naming `name`, the value and the rule) -------------------------
  void require_defined(std::string_view where, std::string_view name) const;
  void require_dtype(std::string_view where, std::string_view name, DType t) const;
  void require_device(std::string_view where, std::string_view name, Device d) const;
  void require_ndim(std::string_view where, std::string_view name, int n) const;
  // Shape must equal `expected`; -1 in expected matches any size.
  void require_shape(std::string_view where, std::string_view name,
                     std::initializer_list<int64_t> expected) const;
  void require_contiguous(std::string_view where, std::string_view name) const;
  // The last dimension must have stride 1 (rows may be strided).
  void require_last_dim_contiguous(std::string_view where, std::string_view name) const;
};

}  // namespace attnkit
