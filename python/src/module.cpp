// attnkit._attnkit: the compiled half of the attnkit Python package. Tensors arrive as DLPack
// (nanobind ndarrays from any framework), CUDA streams as integer handles; nothing here links
// or imports an array framework, so one build serves every PyTorch version.
#include <nanobind/nanobind.h>

#include <nanobind/stl/string.h>

#include <cstdint>

#include "attnkit/device.h"
#include "attnkit/error.h"
#include "core/cuda_archs.h"

namespace nb = nanobind;

namespace attnkit::py {
void register_varlen(nb::module_& m);
void register_flashinfer(nb::module_& m);
void register_kv_ops(nb::module_& m);
void register_native(nb::module_& m);
void register_layer(nb::module_& m);
void register_cli(nb::module_& m);
}  // namespace attnkit::py

NB_MODULE(_attnkit, m) {
  m.doc() = "attnkit native extension (use the attnkit package)";
  // attnkit::Error -> attnkit.AttnkitError(ValueError) carrying the C++ message.
  nb::exception<attnkit::Error>(m, "AttnkitError", PyExc_ValueError);
#if defined(ATTNKIT_WITH_CUDA)
  m.attr("cuda_built") = true;
#else
  m.attr("cuda_built") = false;
#endif
  // The GPU code of this build ("sm_90a"; "no GPU code" without CUDA): CMake ATTNKIT_CUDA_ARCHS.
  m.attr("cuda_archs") = nb::str(attnkit::describe_cuda_archs(attnkit::built_cuda_archs()).c_str());
  // The device error record (attnkit/device.h): read and cleared, as a dict.
  m.def(
      "device_errors",
      [](uintptr_t stream) {
        const attnkit::DeviceErrors e = attnkit::device_errors(reinterpret_cast<void*>(stream));
        nb::dict d;
        d["faults"] = e.faults;
        d["first"] = e.first;
        d["request"] = e.request;
        d["value"] = e.value;
        d["dropped_kv_tokens"] = e.dropped_kv_tokens;
        d["message"] = e.describe();
        return d;
      },
      nb::arg("stream") = 0);
  m.def("set_check_device_errors", &attnkit::set_check_device_errors, nb::arg("on"));
  m.def("check_device_errors_enabled", &attnkit::check_device_errors_enabled);
  attnkit::py::register_varlen(m);
  attnkit::py::register_flashinfer(m);
  attnkit::py::register_kv_ops(m);
  attnkit::py::register_native(m);
  attnkit::py::register_layer(m);
  attnkit::py::register_cli(m);
}
