"""attnkit: attention backends for LLM serving over a paged KV cache.

Tensors cross as DLPack (NumPy, PyTorch, CuPy, JAX); CPU arrays run on the reference backend,
CUDA arrays on the GPU kernels. The extension links no array framework: one build serves every
PyTorch version.

- vLLM / FlashAttention calls: flash_attn_varlen_func, get_scheduler_metadata,
  reshape_and_cache_flash
- FlashInfer wrappers (base-2 LSE): BatchDecodeWithPagedKVCacheWrapper,
  BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper, merge_state,
  merge_state_in_place (module attnkit.flashinfer also has merge_states)
- native API: backends, select, KVCacheSpec, kv_cache_shape, kv_cache_stride_order, write_kv,
  merge_states (natural-log LSE), AttentionLayer (selector + builder + impl: the engine path)
- errors: AttnkitError (a ValueError) carrying the library's message; device_errors /
  check_device_errors: what the GPU kernels found wrong in the metadata (set_check_device_errors:
  check after every call)
"""

from ._attnkit import AttnkitError, cuda_archs, cuda_built
from .flash_attn import flash_attn_varlen_func, get_scheduler_metadata, reshape_and_cache_flash
from .flashinfer import (BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
                         BatchPrefillWithRaggedKVCacheWrapper, merge_state, merge_state_in_place)
from .native import (AttentionLayer, KVCacheSpec, LayerMetadata, Refusal, Selection, backends, kv_cache_shape,
                     kv_cache_stride_order, merge_states, select, write_kv, split_decodes_and_prefills,
                     decode_first_order, device_errors, check_device_errors, set_check_device_errors)

__version__ = "0.1.0"

__all__ = [
    "AttentionLayer", "LayerMetadata", "AttnkitError", "cuda_archs", "cuda_built", "flash_attn_varlen_func", "get_scheduler_metadata",
    "reshape_and_cache_flash",
    "BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper", "merge_state", "merge_state_in_place", "KVCacheSpec",
    "Refusal", "Selection", "backends", "kv_cache_shape", "kv_cache_stride_order", "merge_states",
    "select", "write_kv", "split_decodes_and_prefills", "decode_first_order", "device_errors",
    "check_device_errors", "set_check_device_errors",
]
