"""The Python binding's view of ffpa_library_info_get: what _library.library_info()
and _library.limits() hold is what the C ABI returns, asked once and immutable;
the C ABI's status for a NULL or short struct comes through ctypes. Torch-free."""

import ctypes
import dataclasses

import pytest

from ffpa_attn import _library
from ffpa_attn.decisions import Limits

try:
    LIBRARY = _library.load_library()
except _library.LibraryNotFoundError as error:
    pytest.skip(f"the ffpa C library does not load (build it, or set FFPA_LIBRARY): {error}", allow_module_level=True)

# The C entry point itself, on a handle of its own: not through the binding under test.
C_LIBRARY = ctypes.CDLL(LIBRARY.path)
C_LIBRARY.ffpa_library_info_get.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
C_LIBRARY.ffpa_library_info_get.restype = ctypes.c_int
C_LIBRARY.ffpa_version.restype = ctypes.c_char_p
FFPA_OK, FFPA_NULL_POINTER, FFPA_INVALID_OPTION = 0, 1, 17  # ffpa_status


def c_query(struct_size: int) -> tuple[int, _library.FfpaLibraryInfo, str]:
    info = _library.FfpaLibraryInfo(struct_size=struct_size)
    message = ctypes.create_string_buffer(256)
    status = C_LIBRARY.ffpa_library_info_get(ctypes.addressof(info), message, len(message))
    return status, info, message.value.decode()


def test_binding_equals_the_c_abi():
    status, c, message = c_query(ctypes.sizeof(_library.FfpaLibraryInfo))
    assert status == FFPA_OK, message
    info = _library.library_info()
    assert info.version == c.version.decode() == C_LIBRARY.ffpa_version().decode()
    assert (info.version_major, info.version_minor, info.version_patch) == (
        c.version_major,
        c.version_minor,
        c.version_patch,
    )
    assert info.version == f"{info.version_major}.{info.version_minor}.{info.version_patch}"
    assert (info.min_head_dim, info.max_head_dim, info.head_dim_multiple) == (
        c.min_head_dim,
        c.max_head_dim,
        c.head_dim_multiple,
    )
    assert info.max_sequence_length == c.max_sequence_length
    assert info.cuda_architectures == tuple(c.cuda_architectures[: c.cuda_architecture_count])
    assert info.split_d_head_dims == tuple(c.split_d_head_dims[: c.split_d_head_dim_count])
    assert info.sm90_wgmma_head_dims == tuple(c.sm90_wgmma_head_dims[: c.sm90_wgmma_head_dim_count])
    assert info.sm90_fp8_head_dims == tuple(c.sm90_fp8_head_dims[: c.sm90_fp8_head_dim_count])
    assert info.sm90_backward_head_dims == tuple(c.sm90_backward_head_dims[: c.sm90_backward_head_dim_count])
    assert _library.limits() == Limits(c.min_head_dim, c.max_head_dim, c.head_dim_multiple)


def test_the_struct_has_the_c_size():
    # The library rejects exactly the sizes below its sizeof(ffpa_library_info).
    size = ctypes.sizeof(_library.FfpaLibraryInfo)
    assert c_query(size)[0] == FFPA_OK
    status, _, message = c_query(size - 1)
    assert status == FFPA_INVALID_OPTION
    assert f"struct_size = {size - 1}" in message and str(size) in message


def test_null_info_is_a_null_pointer():
    message = ctypes.create_string_buffer(64)
    assert C_LIBRARY.ffpa_library_info_get(None, message, len(message)) == FFPA_NULL_POINTER
    assert message.value == b"info is null"


def test_fields_land_where_the_c_struct_has_them():
    # A field shifted on the Python side would read neighbouring values: these
    # hold for what the library reports (CMake takes instance head dims as
    # multiples of 64, architectures as sm_50 and newer).
    info = _library.library_info()
    assert 0 < info.min_head_dim <= info.max_head_dim < info.max_sequence_length
    assert info.min_head_dim % info.head_dim_multiple == info.max_head_dim % info.head_dim_multiple == 0
    for dims in (info.split_d_head_dims, info.sm90_wgmma_head_dims, info.sm90_backward_head_dims):
        assert list(dims) == sorted(set(dims))
        assert all(info.min_head_dim <= d <= info.max_head_dim and d % 64 == 0 for d in dims)
    assert info.split_d_head_dims, "every build has split-D instances"
    assert info.cuda_architectures and list(info.cuda_architectures) == sorted(set(info.cuda_architectures))
    assert all(50 <= arch < 1000 for arch in info.cuda_architectures)
    assert not info.sm90_wgmma_head_dims or 90 in info.cuda_architectures
    assert not info.sm90_backward_head_dims or 90 in info.cuda_architectures  # sm_90a kernels too


def test_asked_once_and_immutable():
    import ffpa_attn

    assert ffpa_attn.library_info() is _library.library_info() is _library.library_info()
    assert _library.limits() is _library.limits()
    with pytest.raises(dataclasses.FrozenInstanceError):
        _library.library_info().max_head_dim = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        _library.limits().max_head_dim = 1
