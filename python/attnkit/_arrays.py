"""Framework-neutral helpers: device and stream of an array, allocation like an input, small
conversions. PyTorch (and CuPy) are imported lazily, only when an array of theirs is seen, so the
package works, and the extension builds, without them."""

from __future__ import annotations

import contextlib
import math

import numpy as np

from . import _attnkit as _C

AttnkitError = _C.AttnkitError

# DLPack device types: CPU, CUDA, CUDA pinned host memory, CUDA managed memory.
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13

_FP8_NAMES = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}


def fail(where: str, value: str, rule: str):
    """Raises AttnkitError in the library's format: 'where: value violates: rule'."""
    raise AttnkitError(f"{where}: {value} violates: {rule}")


def framework(x) -> str:
    """'torch', 'numpy', 'cupy', 'jax', ... from the array type's module."""
    return type(x).__module__.split(".")[0]


def is_torch(x) -> bool:
    return framework(x) == "torch"


def is_cuda(x) -> bool:
    """True for arrays in CUDA device (or managed) memory, whatever the framework."""
    if x is None:
        return False
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        return False
    return int(dev()[0]) in (_DL_CUDA, _DL_CUDA_MANAGED)


def check_array(x, where: str, name: str):
    """Rejects objects that are not arrays with a clear message (before nanobind would)."""
    if not hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
        fail(where, f"{name} = {type(x).__name__}", "must be an array (NumPy, PyTorch, CuPy, JAX: any DLPack producer)")
    if getattr(x, "requires_grad", False):  # PyTorch refuses to export these through DLPack
        fail(where, f"{name}.requires_grad = True", "attnkit has no backward: pass tensor.detach() (or run under torch.inference_mode())")


def resolve_stream(stream, *arrays) -> int:
    """The CUDA stream handle for a call: `stream` when given (an int, a torch.cuda.Stream or a
    CuPy stream), else the framework's current stream of the first CUDA array (PyTorch:
    torch.cuda.current_stream(device); CuPy: its current stream), else 0."""
    if stream is not None:
        if isinstance(stream, int):
            return stream
        for attr in ("cuda_stream", "ptr"):
            if hasattr(stream, attr):
                return int(getattr(stream, attr))
        return int(stream)
    for x in arrays:
        if not is_cuda(x):
            continue
        fw = framework(x)
        if fw == "torch":
            import torch

            return int(torch.cuda.current_stream(x.device).cuda_stream)
        if fw == "cupy":
            import cupy

            return int(cupy.cuda.get_current_stream().ptr)
        return 0
    return 0


def device_guard(x):
    """Makes x's CUDA device current for the call (PyTorch tensors); a no-op otherwise."""
    if is_torch(x) and is_cuda(x):
        import torch

        return torch.cuda.device(x.device)
    return contextlib.nullcontext()


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def dtype_name(x) -> str:
    """'float16', 'bfloat16', 'float8_e4m3fn', 'uint8', ... for any framework's array."""
    return str(x.dtype).split(".")[-1]


def empty(like, shape, dtype: str | None = None):
    """An uninitialised array on like's device (dtype name, or like's dtype when None)."""
    fw = framework(like)
    shape = tuple(int(s) for s in shape)
    if fw == "torch":
        import torch

        dt = like.dtype if dtype is None else _torch_dtype(dtype)
        return torch.empty(shape, dtype=dt, device=like.device)
    if isinstance(like, np.ndarray):
        return np.empty(shape, dtype=like.dtype if dtype is None else np.dtype(dtype))
    if fw == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=like.dtype if dtype is None else dtype)
    fail("attnkit", f"array type = {type(like).__module__}.{type(like).__name__}",
         "outputs can be allocated for NumPy, PyTorch and CuPy arrays only: pass out= (and lse=)")


def as_float32(x, where: str, name: str):
    """x as float32 (no copy when it already is; expanded views keep their strides)."""
    if x is None:
        return None
    if isinstance(x, (float, int)):
        return np.array([x], dtype=np.float32)
    check_array(x, where, name)
    if dtype_name(x) == "float32":
        return x
    if is_torch(x):
        import torch

        return x.to(torch.float32)
    return x.astype("float32")


def scale_like(v, like, where: str, name: str):
    """A dequant scale given as a Python number or an array, as a float32 array on like's
    device."""
    if v is None:
        return None
    if isinstance(v, (float, int)):
        if is_torch(like):
            import torch

            return torch.tensor([float(v)], dtype=torch.float32, device=like.device)
        if isinstance(like, np.ndarray):
            return np.array([v], dtype=np.float32)
        if framework(like) == "cupy":
            import cupy

            return cupy.asarray([v], dtype=cupy.float32)
        fail(where, f"{name} = {v}", "pass the scale as an array on the cache's device")
    return as_float32(v, where, name)


def split_fp8(x):
    """(array, cache dtype name or None): fp8 arrays are passed to the extension as their uint8
    bytes (DLPack has fp8 codes, but not every framework version exports them), with the fp8
    format named separately."""
    if x is None:
        return None, None
    name = dtype_name(x)
    fmt = _FP8_NAMES.get(name)
    if fmt is None:
        return x, None
    if is_torch(x):
        import torch

        return x.view(torch.uint8), fmt
    return x.view(np.uint8), fmt


def cache_dtype_for(kv_cache_dtype: str | None, *fp8_formats) -> str:
    """vLLM's kv_cache_dtype string after looking at the caches' own fp8 dtype ("auto" on an fp8
    tensor means that fp8 format)."""
    want = "auto" if kv_cache_dtype in (None, "auto") else kv_cache_dtype
    fmts = {f for f in fp8_formats if f is not None}
    if len(fmts) > 1:
        fail("attnkit", f"cache dtypes = {sorted(fmts)}", "K and V caches must share one dtype")
    if fmts:
        fmt = fmts.pop()
        if want == "auto":
            return fmt
        if want not in ("fp8", fmt):
            fail("attnkit", f"kv_cache_dtype = '{want}'", f"does not match the cache tensors' {fmt}")
        return fmt
    return want


def host_int32(x, where: str, name: str) -> np.ndarray:
    """A small index array as a host int32 NumPy array (copies from the GPU when needed)."""
    if isinstance(x, np.ndarray):
        a = x
    elif isinstance(x, (list, tuple, range)):
        a = np.asarray(x)
    elif is_torch(x):
        a = x.detach().cpu().numpy()
    elif framework(x) == "cupy":
        a = x.get()
    else:
        a = np.from_dlpack(x)
    if a.dtype.kind not in "iu":
        fail(where, f"{name}.dtype = {a.dtype}", "must be an integer array")
    if a.size and (a.max() > np.iinfo(np.int32).max or a.min() < np.iinfo(np.int32).min):
        fail(where, f"{name} max = {a.max()}", "must fit in int32")
    return np.ascontiguousarray(a, dtype=np.int32)


def contiguous(x):
    """A row-major copy of x when it is not one already (NumPy, PyTorch, CuPy)."""
    if is_torch(x):
        return x.contiguous()
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x)
    if framework(x) == "cupy":
        import cupy

        return cupy.ascontiguousarray(x)
    return x


def copy(x):
    """A row-major copy of x that never aliases it."""
    if is_torch(x):
        return x.clone(memory_format=_torch_contiguous())
    if isinstance(x, np.ndarray):
        return np.array(x, order="C", copy=True)
    if framework(x) == "cupy":
        import cupy

        return cupy.array(x, order="C", copy=True)
    fail("attnkit", f"array type = {type(x).__module__}", "copies are made for NumPy, PyTorch and CuPy arrays only")


def _torch_contiguous():
    import torch

    return torch.contiguous_format


LN2 = math.log(2.0)
