#include "attnkit/tensor.h"

#include <sstream>

#include "attnkit/error.h"

namespace attnkit {

std::string_view device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

static void fill_contiguous_strides(TensorView& t) {
  int64_t s = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.strides[d] = s;
    s *= t.shape[d];
  }
}

TensorView::TensorView(void* data_, DType dtype_, std::initializer_list<int64_t> shape_,
                       Device device_, int device_index_)
    : data(data_), dtype(dtype_), device(device_), device_index(device_index_) {
  ATTNKIT_REQUIRE(shape_.size() <= kMaxDims, "TensorView", "ndim", shape_.size(),
                  "must be <= 6");
  ndim = static_cast<int>(shape_.size());
  int i = 0;
  for (int64_t s : shape_) {
    ATTNKIT_REQUIRE(s >= 0, "TensorView", "shape[" + std::to_string(i) + "]", s, "must be >= 0");
    shape[i++] = s;
  }
  fill_contiguous_strides(*this);
}

TensorView::TensorView(void* data_, DType dtype_, std::initializer_list<int64_t> shape_,
                       std::initializer_list<int64_t> strides_, Device device_, int device_index_)
    : TensorView(data_, dtype_, shape_, device_, device_index_) {
  ATTNKIT_REQUIRE(strides_.size() == shape_.size(), "TensorView", "strides.size()",
                  strides_.size(), "must equal shape.size() = " + std::to_string(shape_.size()));
  int i = 0;
  for (int64_t s : strides_) strides[i++] = s;
}

int64_t TensorView::size(int d) const {
  const int i = d < 0 ? d + ndim : d;
  ATTNKIT_REQUIRE(i >= 0 && i < ndim, "TensorView::size", "dim", d,
                  "must index one of the " + std::to_string(ndim) + " dims");
  return shape[i];
}

int64_t TensorView::stride(int d) const {
  const int i = d < 0 ? d + ndim : d;
  ATTNKIT_REQUIRE(i >= 0 && i < ndim, "TensorView::stride", "dim", d,
                  "must index one of the " + std::to_string(ndim) + " dims");
  return strides[i];
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != s) return false;
    s *= shape[d];
  }
  return true;
}

std::string TensorView::shape_str() const {
  std::ostringstream os;
  os << '[';
  for (int d = 0; d < ndim; ++d) os << (d ? ", " : "") << shape[d];
  os << ']';
  return os.str();
}

void TensorView::require_defined(std::string_view where, std::string_view name) const {
  ATTNKIT_REQUIRE(data != nullptr || numel() == 0, where, std::string(name) + ".data",
                  "nullptr", "a required tensor must point at memory");
  ATTNKIT_REQUIRE(ndim > 0 || data != nullptr, where, name, "undefined",
                  "this tensor is required");
}

void TensorView::require_dtype(std::string_view where, std::string_view name, DType t) const {
  ATTNKIT_REQUIRE(dtype == t, where, std::string(name) + ".dtype", dtype_name(dtype),
                  "must be " + std::string(dtype_name(t)));
}

void TensorView::require_device(std::string_view where, std::string_view name, Device d) const {
  ATTNKIT_REQUIRE(device == d, where, std::string(name) + ".device", device_name(device),
                  "must be " + std::string(device_name(d)) + " like the other operands");
}

void TensorView::require_ndim(std::string_view where, std::string_view name, int n) const {
  ATTNKIT_REQUIRE(ndim == n, where, std::string(name) + ".shape", shape_str(),
                  "must have " + std::to_string(n) + " dims");
}

void TensorView::require_shape(std::string_view where, std::string_view name,
                               std::initializer_list<int64_t> expected) const {
  bool ok = static_cast<int>(expected.size()) == ndim;
  std::ostringstream want;
  want << '[';
  int d = 0;
  for (int64_t e : expected) {
    want << (d ? ", " : "") << (e < 0 ? std::string("*") : std::to_string(e));
    if (ok && e >= 0 && shape[d] != e) ok = false;
    ++d;
  }
  want << ']';
  ATTNKIT_REQUIRE(ok, where, std::string(name) + ".shape", shape_str(), "must be " + want.str());
}

void TensorView::require_contiguous(std::string_view where, std::string_view name) const {
  if (is_contiguous()) return;
  std::ostringstream os;
  os << '[';
  for (int d = 0; d < ndim; ++d) os << (d ? ", " : "") << strides[d];
  os << ']';
  fail(where, std::string(name) + ".strides", os.str(),
       "must be contiguous (row-major) for shape " + shape_str());
}

void TensorView::require_last_dim_contiguous(std::string_view where, std::string_view name) const {
  ATTNKIT_REQUIRE(ndim > 0 && (strides[ndim - 1] == 1 || shape[ndim - 1] == 1), where,
                  std::string(name) + ".stride(-1)", ndim > 0 ? strides[ndim - 1] : 0,
                  "the last dim must be contiguous (stride 1)");
}

}  // namespace attnkit
