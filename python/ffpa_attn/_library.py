"""ctypes binding of the ffpa C ABI (include/ffpa/ffpa.h), and where the library is found.

Torch-free: the structs take raw pointers, shapes and strides, so the benchmark
and tests can call the library on any buffer (the C library runs its CPU
reference on host pointers). The library is looked up, in order, at:
  1. the file named by the environment variable FFPA_LIBRARY,
  2. ffpa_attn/lib/libffpa.so* (where the wheel, `pip install .` from the repository root, puts it),
  3. ctypes.util.find_library("ffpa") (the system's library path).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .decisions import Limits

LIBRARY_ENV = "FFPA_LIBRARY"
PACKAGE_LIBRARY_DIR = Path(__file__).resolve().parent / "lib"
MESSAGE_BYTES = 2048


# --- the C ABI's enums (ffpa.h); the names match CUDABackend's strings, upper-cased ---


class DType(enum.IntEnum):
    F16 = 0
    BF16 = 1
    F32 = 2  # q, k, v: the CPU reference only (so is F64)
    BOOL = 3  # 1 byte, nonzero = attend
    F64 = 4
    U8 = 5  # 8-bit codes (e4m3 or int8 as the FP8 options say): an FP8 KV cache's codes only
    E4M3 = 6  # k and v of an FP8 KV cache in the serving engines' format (k_descale, v_descale)
    I32 = 7  # a sequence batch's lengths and block table


class Causal(enum.IntEnum):
    NONE = 0
    TOP_LEFT = 1
    BOTTOM_RIGHT = 2


class Accumulation(enum.IntEnum):
    F32 = 0
    F16 = 1


class Impl(enum.IntEnum):
    AUTO = 0
    CPU_REFERENCE = 1
    SM80_SPLIT_D = 2
    SM90_WGMMA = 3


class Precision(enum.IntEnum):
    INPUT = 0  # the inputs' fp16/bf16
    FP8 = 1  # Hopper's 8-bit tensor cores (the sm90 family only)


class Fp8QkFormat(enum.IntEnum):  # CUDABackend.fp8_qk
    INT8 = 0
    E4M3 = 1


class Fp8QkScales(enum.IntEnum):  # CUDABackend.fp8_qk_scales
    PER_THREAD_GROUP = 0
    PER_BLOCK = 1


class Fp8VScales(enum.IntEnum):  # CUDABackend.fp8_v_scales
    PER_CHANNEL = 0
    PER_BLOCK = 1


# --- the C ABI's structs, field by field ---


class FfpaTensor(ctypes.Structure):
    """ffpa_tensor; a zero-initialised one (data NULL) is an absent mask or lse."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),  # in elements
    ]


class FfpaFp8Options(ctypes.Structure):
    """ffpa_fp8_options: read with precision FP8 only; zero means each knob's default."""

    _fields_ = [
        ("qk_format", ctypes.c_int32),  # Fp8QkFormat
        ("qk_scales", ctypes.c_int32),  # Fp8QkScales
        ("no_smooth_k", ctypes.c_int32),  # nonzero: do not subtract K's mean
        ("has_early_rows", ctypes.c_int32),  # 0: early_rows = 256 with a causal mask, else 0
        ("early_rows", ctypes.c_int64),  # a multiple of 64
        ("v_scales", ctypes.c_int32),  # Fp8VScales
        ("smooth_v", ctypes.c_int32),  # nonzero: subtract V's mean first (not with dropout)
    ]


class FfpaOptions(ctypes.Structure):
    _fields_ = [
        ("has_scale", ctypes.c_int32),  # 0: scale = 1/sqrt(D)
        ("scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("dropout_p", ctypes.c_float),
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        ("accumulation", ctypes.c_int32),
        ("impl", ctypes.c_int32),
        ("precision", ctypes.c_int32),  # Precision
        ("fp8", FfpaFp8Options),
        ("has_window", ctypes.c_int32),  # 0: no sliding window (both bounds -1)
        ("window_left", ctypes.c_int64),  # -1: unbounded
        ("window_right", ctypes.c_int64),
        ("softcap", ctypes.c_float),  # 0: none
    ]


class FfpaSequenceBatch(ctypes.Structure):
    """ffpa_sequence_batch: a batch of sequences of different lengths (int32 tensors; data NULL: absent)."""

    _fields_ = [
        ("cu_seqlens_q", FfpaTensor),  # [B + 1]: packed q
        ("cu_seqlens_k", FfpaTensor),  # [B + 1]: packed k, v
        ("block_table", FfpaTensor),  # [B, max_blocks]: paged k, v
        ("seqused_k", FfpaTensor),  # [B]
        ("max_seqlen_q", ctypes.c_int64),  # 0: derived
        ("max_seqlen_k", ctypes.c_int64),
    ]


class FfpaFp8KvCache(ctypes.Structure):
    """ffpa_fp8_kv_cache: K and V already quantized (dense tensors in device memory;
    ffpa_fp8_kv_cache_layout gives their shapes). k_mean / v_mean: data NULL when absent."""

    _fields_ = [
        ("k_codes", FfpaTensor),  # U8 [B, Hkv, Nkv, round_up(D, 16)]
        ("k_scales", FfpaTensor),  # F32 [B, Hkv, k_count]
        ("k_mean", FfpaTensor),  # F32 [B, Hkv, D]
        ("v_codes", FfpaTensor),  # U8 [B, Hkv, D, round_up(Nkv, 16)] (V^T)
        ("v_scales", FfpaTensor),  # F32 [B, Hkv, v_count]
        ("v_mean", FfpaTensor),  # F32 [B, Hkv, D]
    ]


class FfpaForwardParams(ctypes.Structure):
    _fields_ = [
        ("q", FfpaTensor),
        ("k", FfpaTensor),
        ("v", FfpaTensor),
        ("o", FfpaTensor),
        ("mask", FfpaTensor),
        ("lse", FfpaTensor),
        ("options", FfpaOptions),
        ("stream", ctypes.c_void_p),  # cudaStream_t; NULL: the default stream
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("fp8_kv_cache", ctypes.POINTER(FfpaFp8KvCache)),  # NULL: none (precision FP8 only)
        ("sinks", FfpaTensor),  # f32 [Hq]; data NULL: none
        ("k_descale", FfpaTensor),  # f32 [B, Hkv] with e4m3 k, v; data NULL: 1
        ("v_descale", FfpaTensor),
        ("sequences", ctypes.POINTER(FfpaSequenceBatch)),  # NULL: a dense call
        ("sequence_plan", ctypes.c_void_p),  # NULL: the call plans its sequences itself
    ]


class FfpaFp8QuantizeKvParams(ctypes.Structure):
    """ffpa_fp8_quantize_kv_params: k and v into an FP8 KV cache, as the FP8 pre-pass quantizes them."""

    _fields_ = [
        ("k", FfpaTensor),
        ("v", FfpaTensor),
        ("cache", FfpaFp8KvCache),  # written
        ("fp8", FfpaFp8Options),  # zero: the defaults; early_rows is not read
        ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),  # NULL: stream-ordered memory
        ("workspace_bytes", ctypes.c_size_t),
    ]


class FfpaBackwardParams(ctypes.Structure):
    """ffpa_backward_params: the forward call's tensors and options, d_o (and d_lse), the gradients."""

    _fields_ = [
        ("q", FfpaTensor),
        ("k", FfpaTensor),
        ("v", FfpaTensor),
        ("o", FfpaTensor),
        ("lse", FfpaTensor),  # the forward's, required
        ("mask", FfpaTensor),
        ("d_o", FfpaTensor),
        ("d_q", FfpaTensor),
        ("d_k", FfpaTensor),
        ("d_v", FfpaTensor),
        ("d_mask", FfpaTensor),  # data NULL: not requested
        ("d_lse", FfpaTensor),  # data NULL: zero
        ("options", FfpaOptions),
        ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("sequences", ctypes.POINTER(FfpaSequenceBatch)),  # NULL: a dense call (packed / batched keys only)
        ("sinks", FfpaTensor),  # the forward's f32 [Hq]; data NULL: none
        ("d_sinks", FfpaTensor),  # f32 [Hq]; data NULL: not requested
    ]


LIBRARY_INFO_MAX_ARCHITECTURES = 8  # FFPA_LIBRARY_INFO_MAX_ARCHITECTURES
LIBRARY_INFO_MAX_HEAD_DIMS = 16  # FFPA_LIBRARY_INFO_MAX_HEAD_DIMS


class FfpaLibraryInfo(ctypes.Structure):
    """ffpa_library_info; struct_size must be set to its size before the query."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("version", ctypes.c_char_p),
        ("version_major", ctypes.c_int32),
        ("version_minor", ctypes.c_int32),
        ("version_patch", ctypes.c_int32),
        ("min_head_dim", ctypes.c_int32),
        ("max_head_dim", ctypes.c_int32),
        ("head_dim_multiple", ctypes.c_int32),
        ("max_sequence_length", ctypes.c_int64),
        ("cuda_architecture_count", ctypes.c_int32),
        ("cuda_architectures", ctypes.c_int32 * LIBRARY_INFO_MAX_ARCHITECTURES),
        ("split_d_head_dim_count", ctypes.c_int32),
        ("split_d_head_dims", ctypes.c_int32 * LIBRARY_INFO_MAX_HEAD_DIMS),
        ("sm90_wgmma_head_dim_count", ctypes.c_int32),
        ("sm90_wgmma_head_dims", ctypes.c_int32 * LIBRARY_INFO_MAX_HEAD_DIMS),
        ("sm90_fp8_head_dim_count", ctypes.c_int32),
        ("sm90_fp8_head_dims", ctypes.c_int32 * LIBRARY_INFO_MAX_HEAD_DIMS),
        ("sm90_backward_head_dim_count", ctypes.c_int32),
        ("sm90_backward_head_dims", ctypes.c_int32 * LIBRARY_INFO_MAX_HEAD_DIMS),
    ]


# The sizes the C compiler gives these structs on x86-64 and aarch64: a field
# added on one side only would shift every later field silently
# (tests/cpu/test_c_api.cpp static_asserts the same numbers on the C side).
assert ctypes.sizeof(FfpaTensor) == 80
assert ctypes.sizeof(FfpaFp8Options) == 32
assert FfpaFp8Options.v_scales.offset == 24 and FfpaFp8Options.smooth_v.offset == 28
assert ctypes.sizeof(FfpaOptions) == 112 and FfpaOptions.softcap.offset == 104
assert FfpaOptions.precision.offset == 40 and FfpaOptions.fp8.offset == 48
assert ctypes.sizeof(FfpaForwardParams) == 880 and FfpaForwardParams.fp8_kv_cache.offset == 616
assert FfpaForwardParams.sequences.offset == 864 and FfpaForwardParams.sequence_plan.offset == 872
assert ctypes.sizeof(FfpaSequenceBatch) == 336
assert ctypes.sizeof(FfpaFp8KvCache) == 480
assert ctypes.sizeof(FfpaFp8QuantizeKvParams) == 696 and FfpaFp8QuantizeKvParams.fp8.offset == 640
assert FfpaLibraryInfo.sm90_backward_head_dim_count.offset == 288 and ctypes.sizeof(FfpaLibraryInfo) == 360


@dataclass(frozen=True)
class LibraryInfo:
    """What the loaded library serves (ffpa_library_info), read once when it loads."""

    version: str
    version_major: int
    version_minor: int
    version_patch: int
    min_head_dim: int
    max_head_dim: int
    head_dim_multiple: int
    max_sequence_length: int  # longest Nq or Nkv the GPU implementations serve
    cuda_architectures: tuple[int, ...]  # compiled, 10 * major + minor, ascending
    split_d_head_dims: tuple[int, ...]  # head dims with their own sm80_split_d instance
    sm90_wgmma_head_dims: tuple[int, ...]  # empty when the build has no sm_90a
    sm90_fp8_head_dims: tuple[int, ...] = ()  # precision "fp8": each serves every D up to it
    sm90_backward_head_dims: tuple[int, ...] = ()  # the Hopper backward: each serves every D and Dv up to it

    @property
    def limits(self) -> Limits:
        """The head dims the library's validation accepts, as decisions.py takes them."""
        return Limits(self.min_head_dim, self.max_head_dim, self.head_dim_multiple)

    @classmethod
    def from_c(cls, c: FfpaLibraryInfo) -> LibraryInfo:
        return cls(
            version=c.version.decode(),
            version_major=c.version_major,
            version_minor=c.version_minor,
            version_patch=c.version_patch,
            min_head_dim=c.min_head_dim,
            max_head_dim=c.max_head_dim,
            head_dim_multiple=c.head_dim_multiple,
            max_sequence_length=c.max_sequence_length,
            cuda_architectures=tuple(c.cuda_architectures[: c.cuda_architecture_count]),
            split_d_head_dims=tuple(c.split_d_head_dims[: c.split_d_head_dim_count]),
            sm90_wgmma_head_dims=tuple(c.sm90_wgmma_head_dims[: c.sm90_wgmma_head_dim_count]),
            sm90_fp8_head_dims=tuple(c.sm90_fp8_head_dims[: c.sm90_fp8_head_dim_count]),
            sm90_backward_head_dims=tuple(c.sm90_backward_head_dims[: c.sm90_backward_head_dim_count]),
        )


def tensor(data: int, dtype: DType, shape: Sequence[int], strides: Sequence[int]) -> FfpaTensor:
    """An ffpa_tensor for the buffer at address `data` (strides in elements)."""
    if len(shape) != len(strides) or not 1 <= len(shape) <= 4:
        raise ValueError(f"shape {tuple(shape)} and strides {tuple(strides)} must have one length in [1, 4]")
    return FfpaTensor(data=data, dtype=dtype, rank=len(shape), shape=tuple(shape), stride=tuple(strides))


# --- errors ---


class FFPAError(RuntimeError):
    """A non-zero ffpa_status: status_name (e.g. "misaligned", from ffpa_status_name) and the library's message."""

    def __init__(self, status_name: str, message: str) -> None:
        super().__init__(f"{status_name}: {message}")
        self.status_name = status_name
        self.message = message


class LibraryNotFoundError(ImportError):
    """No loadable ffpa C library at any of the places load_library() looks."""


# --- the loaded library ---


class Library:
    """The ffpa shared library, opened with ctypes, with its entry points typed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._dll = ctypes.CDLL(path)
        self._dll.ffpa_forward.argtypes = [ctypes.POINTER(FfpaForwardParams), ctypes.c_char_p, ctypes.c_size_t]
        self._dll.ffpa_forward.restype = ctypes.c_int
        # ffpa_forward without argtypes, for the eager fast path (ops.launch), which passes
        # exactly a byref of its FfpaForwardParams, a message buffer and a c_size_t, so that
        # ctypes converts nothing: 0.5 us less per call than through argtypes.
        self.forward_unprototyped = self._dll._FuncPtr(("ffpa_forward", self._dll))
        self.forward_unprototyped.restype = ctypes.c_int
        self._dll.ffpa_workspace_size.argtypes = [
            ctypes.POINTER(FfpaForwardParams),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        self._dll.ffpa_workspace_size.restype = ctypes.c_int
        self._dll.ffpa_backward.argtypes = [ctypes.POINTER(FfpaBackwardParams), ctypes.c_char_p, ctypes.c_size_t]
        self._dll.ffpa_backward.restype = ctypes.c_int
        self._dll.ffpa_backward_workspace_size.argtypes = [
            ctypes.POINTER(FfpaBackwardParams),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        self._dll.ffpa_backward_workspace_size.restype = ctypes.c_int
        self._dll.ffpa_fp8_kv_cache_layout.argtypes = [
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.POINTER(FfpaFp8Options),
            ctypes.POINTER(FfpaFp8KvCache),
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        self._dll.ffpa_fp8_kv_cache_layout.restype = ctypes.c_int
        self._dll.ffpa_fp8_quantize_kv.argtypes = [
            ctypes.POINTER(FfpaFp8QuantizeKvParams),
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        self._dll.ffpa_fp8_quantize_kv.restype = ctypes.c_int
        self._dll.ffpa_fp8_quantize_kv_workspace_size.argtypes = [
            ctypes.POINTER(FfpaFp8QuantizeKvParams),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        self._dll.ffpa_fp8_quantize_kv_workspace_size.restype = ctypes.c_int
        self._dll.ffpa_status_name.argtypes = [ctypes.c_int]
        self._dll.ffpa_status_name.restype = ctypes.c_char_p
        self._dll.ffpa_version.argtypes = []
        self._dll.ffpa_version.restype = ctypes.c_char_p
        self._dll.ffpa_library_info_get.argtypes = [
            ctypes.POINTER(FfpaLibraryInfo),
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        self._dll.ffpa_library_info_get.restype = ctypes.c_int
        self._dll.ffpa_device_support.argtypes = [ctypes.c_int32, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t]
        self._dll.ffpa_device_support.restype = ctypes.c_int
        self._device_support: dict[tuple[int, int], FFPAError | None] = {}
        self._dll.ffpa_backward_route.argtypes = [
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int32,
            ctypes.POINTER(ctypes.c_int32),
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        self._dll.ffpa_backward_route.restype = ctypes.c_int
        self._backward_routes: dict[tuple[int, int, int, int, int], Impl | FFPAError] = {}
        # Constant for the library's lifetime: asked once, here.
        self.info = LibraryInfo.from_c(self.query_library_info())
        self.limits = self.info.limits

    def _checked(self, function, *arguments) -> None:
        """Calls a C ABI function that ends in (message, message bytes) with a fresh message buffer;
        raises FFPAError on a non-zero status."""
        message = ctypes.create_string_buffer(MESSAGE_BYTES)
        status = function(*arguments, message, MESSAGE_BYTES)
        if status != 0:
            raise self.error(status, message)

    def query_library_info(self) -> FfpaLibraryInfo:
        """ffpa_library_info_get, as the C ABI fills the struct; raises FFPAError on a non-zero status."""
        info = FfpaLibraryInfo(struct_size=ctypes.sizeof(FfpaLibraryInfo))
        self._checked(self._dll.ffpa_library_info_get, ctypes.byref(info))
        return info

    def device_support(self, device: int, impl: Impl = Impl.AUTO) -> FFPAError | None:
        """ffpa_device_support: None when the library runs impl's kernels on CUDA device
        `device`, else the FFPAError that says why not (returned, not raised; status
        impl_unavailable for a device without a kernel image, a driver too old, no driver).

        The answer is fixed for the process: asked of the library once per device and impl.
        """
        key = (device, int(impl))
        if key not in self._device_support:  # two threads may both ask: same answer
            message = ctypes.create_string_buffer(MESSAGE_BYTES)
            status = self._dll.ffpa_device_support(device, int(impl), message, MESSAGE_BYTES)
            self._device_support[key] = (
                None if status == 0 else self.error(status, message)
            )
        return self._device_support[key]

    def backward_route(
        self, device: int, dtype: DType, head_dim: int, value_dim: int, impl: Impl = Impl.AUTO
    ) -> Impl | FFPAError:
        """ffpa_backward_route: the Impl ffpa_backward runs (SM90_WGMMA: the Hopper kernels; SM80_SPLIT_D:
        the portable ones) for a call on CUDA device `device` of `dtype` with head dims `head_dim` (q, k)
        and `value_dim` (v) under `impl`, or the FFPAError that says why none (returned, not raised;
        status impl_unavailable for a device without the kernels or none at all).

        The library's own plan answers (for a dense, aligned call, as the bindings pass them: the plan
        reads nothing else of a call that could change it), fixed for the process: asked once per arguments.
        """
        key = (device, int(dtype), head_dim, value_dim, int(impl))
        if key not in self._backward_routes:  # two threads may both ask: same answer
            message = ctypes.create_string_buffer(MESSAGE_BYTES)
            chosen = ctypes.c_int32(-1)
            status = self._dll.ffpa_backward_route(
                device, int(dtype), head_dim, value_dim, int(impl), ctypes.byref(chosen), message, MESSAGE_BYTES
            )
            self._backward_routes[key] = Impl(chosen.value) if status == 0 else self.error(status, message)
        return self._backward_routes[key]

    def version(self) -> str:
        return self._dll.ffpa_version().decode()

    def status_name(self, status: int) -> str:
        return self._dll.ffpa_status_name(status).decode()

    def error(self, status: int, message: ctypes.Array) -> FFPAError:
        """The FFPAError of a non-zero status and the message buffer the call filled."""
        return FFPAError(self.status_name(status), message.value.decode(errors="replace"))

    def workspace_size(self, params: FfpaForwardParams) -> int:
        """ffpa_workspace_size: the bytes of workspace the call would use (on the current
        device); raises FFPAError on a non-zero status."""
        size = ctypes.c_size_t(0)
        self._checked(self._dll.ffpa_workspace_size, ctypes.byref(params), ctypes.byref(size))
        return size.value

    def backward_workspace_size(self, params: FfpaBackwardParams) -> int:
        """ffpa_backward_workspace_size (on the current device); raises FFPAError on a non-zero status."""
        size = ctypes.c_size_t(0)
        self._checked(self._dll.ffpa_backward_workspace_size, ctypes.byref(params), ctypes.byref(size))
        return size.value

    def backward(self, params: FfpaBackwardParams) -> None:
        """ffpa_backward; raises FFPAError on a non-zero status."""
        self._checked(self._dll.ffpa_backward, ctypes.byref(params))

    def fp8_kv_cache_layout(
        self, batch: int, heads_kv: int, seq_kv: int, head_dim: int, fp8: FfpaFp8Options | None = None
    ) -> FfpaFp8KvCache:
        """ffpa_fp8_kv_cache_layout: the FP8 KV cache's tensors (dtype, shape, dense strides;
        data NULL) for K [batch, heads_kv, seq_kv, head_dim]; raises FFPAError on a non-zero status."""
        layout = FfpaFp8KvCache()
        knobs = ctypes.byref(fp8) if fp8 is not None else None
        self._checked(
            self._dll.ffpa_fp8_kv_cache_layout, batch, heads_kv, seq_kv, head_dim, knobs, ctypes.byref(layout)
        )
        return layout

    def fp8_quantize_kv(self, params: FfpaFp8QuantizeKvParams) -> None:
        """ffpa_fp8_quantize_kv; raises FFPAError on a non-zero status."""
        self._checked(self._dll.ffpa_fp8_quantize_kv, ctypes.byref(params))

    def fp8_quantize_kv_workspace_size(self, params: FfpaFp8QuantizeKvParams) -> int:
        """ffpa_fp8_quantize_kv_workspace_size: scratch bytes the call would use."""
        size = ctypes.c_size_t(0)
        self._checked(self._dll.ffpa_fp8_quantize_kv_workspace_size, ctypes.byref(params), ctypes.byref(size))
        return size.value

    def forward(self, params: FfpaForwardParams) -> None:
        """ffpa_forward; raises FFPAError on a non-zero status."""
        # One message buffer per thread: calls from several threads must not share one.
        message = getattr(_thread_buffers, "message", None)
        if message is None:
            message = _thread_buffers.message = ctypes.create_string_buffer(MESSAGE_BYTES)
        status = self._dll.ffpa_forward(ctypes.byref(params), message, MESSAGE_BYTES)
        if status != 0:
            raise self.error(status, message)


_loaded: Library | None = None
_load_lock = threading.Lock()
_thread_buffers = threading.local()


def load_library() -> Library:
    """The ffpa library, opened on the first call (see the module docstring for where)."""
    global _loaded
    with _load_lock:
        if _loaded is None:
            _loaded = _open_library()
        return _loaded


def library_path() -> str:
    """The path (or, when found by the system, the name) of the loaded ffpa library."""
    return load_library().path


def library_info() -> LibraryInfo:
    """What the loaded library serves: limits, instance head dims, architectures, version."""
    return load_library().info


def limits() -> Limits:
    """The head dims the loaded library accepts (decisions.Limits)."""
    return load_library().limits


def forward(params: FfpaForwardParams) -> None:
    """ffpa_forward on the loaded library; raises FFPAError on a non-zero status."""
    (_loaded or load_library()).forward(params)


def backward(params: FfpaBackwardParams) -> None:
    """ffpa_backward on the loaded library; raises FFPAError on a non-zero status."""
    (_loaded or load_library()).backward(params)


def backward_workspace_size(params: FfpaBackwardParams) -> int:
    """ffpa_backward_workspace_size on the loaded library."""
    return (_loaded or load_library()).backward_workspace_size(params)


def workspace_size(params: FfpaForwardParams) -> int:
    """ffpa_workspace_size on the loaded library."""
    return (_loaded or load_library()).workspace_size(params)


_MESSAGE_SIZE = ctypes.c_size_t(MESSAGE_BYTES)


def forward_prepared(params_ref, message: ctypes.Array) -> None:
    """ffpa_forward for a caller that keeps its FfpaForwardParams (params_ref: its
    ctypes.byref) and a MESSAGE_BYTES buffer (ops.launch's per-thread slots): the
    eager path's call, without argument conversions. Raises FFPAError on a non-zero status."""
    library = _loaded or load_library()
    status = library.forward_unprototyped(params_ref, message, _MESSAGE_SIZE)
    if status != 0:
        raise library.error(status, message)


def device_support(device: int, impl: Impl = Impl.AUTO) -> FFPAError | None:
    """Why the loaded library cannot run impl's kernels on CUDA device `device` (an
    FFPAError, not raised), or None when it can (Library.device_support)."""
    return load_library().device_support(device, impl)


def backward_route(
    device: int, dtype: DType, head_dim: int, value_dim: int, impl: Impl = Impl.AUTO
) -> Impl | FFPAError:
    """The Impl the loaded library's backward runs for such a call on CUDA device `device`, or the
    FFPAError that says why none does (Library.backward_route)."""
    return load_library().backward_route(device, dtype, head_dim, value_dim, impl)


def _open_library() -> Library:
    named = os.environ.get(LIBRARY_ENV)
    if named:
        # An explicit choice that fails is an error, not a reason to load another copy.
        try:
            return Library(named)
        except (OSError, AttributeError) as error:
            raise LibraryNotFoundError(f"ffpa_attn: cannot load {LIBRARY_ENV}={named!r}: {error}") from error

    tried = []
    packaged = sorted(PACKAGE_LIBRARY_DIR.glob("libffpa.so*"))
    for path in packaged:
        try:
            return Library(str(path))
        except (OSError, AttributeError) as error:
            tried.append(f"{path}: {error}")
    if not packaged:
        tried.append(f"{PACKAGE_LIBRARY_DIR}/libffpa.so*: no such file")

    system_name = ctypes.util.find_library("ffpa")
    if system_name is None:
        tried.append('ctypes.util.find_library("ffpa"): not found')
    else:
        try:
            return Library(system_name)
        except (OSError, AttributeError) as error:
            tried.append(f"{system_name} (from ctypes.util.find_library): {error}")

    raise LibraryNotFoundError(
        f"ffpa_attn: cannot find the ffpa C library. {LIBRARY_ENV} is not set, and:\n"
        + "".join(f"  - {entry}\n" for entry in tried)
        + f"Install with `pip install .` from the repository root (builds the library), or set {LIBRARY_ENV} "
        "to the path of a prebuilt libffpa.so."
    )
