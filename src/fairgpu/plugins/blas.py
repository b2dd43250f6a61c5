"""NumPy's own matrix-vector products, callable from compiled kernels.

`matrix @ w` in float32 (OpenBLAS's sgemv) rounds a row by the rows batched with it, and by a different
summation than any loop of ours, so a kernel cannot recompute it; it can call the very routines NumPy calls.
NumPy's wheels carry OpenBLAS (`numpy.libs/libscipy_openblas64_*.so`, loaded with NumPy): its matmul of a
C-contiguous (m, T) matrix by a (T,) vector is `cblas_?dot` for one row and `cblas_?gemv` (column-major,
transposed) for more (tests/test_blas.py checks the results bit for bit against `@`). The symbols are
registered with LLVM by name, so kernels calling them stay cacheable (the kernels calling them,
`fragmentation_kernels.matvec32` and `matvec64`, live beside their callers: numba's disk cache notices a
change in a kernel's own file, not in another module's). `AVAILABLE` is False where NumPy has no
such library (another build, another C library): the plugins then run their NumPy path.
"""

from __future__ import annotations

import ctypes
from typing import Any

import llvmlite.binding as llvm  # type: ignore[import-untyped]  # llvmlite ships no type information
import numba

types: Any = numba.types  # numba's type objects build signatures by calls mypy cannot follow

COL_MAJOR, TRANS = 102, 112  # CBLAS_ORDER and CBLAS_TRANSPOSE
_NAMES = ("scipy_cblas_sdot64_", "scipy_cblas_sgemv64_", "scipy_cblas_ddot64_", "scipy_cblas_dgemv64_")
_LIBRARY = b"libscipy_openblas64_"


class _Loaded(ctypes.Structure):
    """The head of glibc's `struct dl_phdr_info`: a loaded object's base address and path."""

    _fields_ = (("base", ctypes.c_void_p), ("path", ctypes.c_char_p))


_VISIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_Loaded), ctypes.c_size_t, ctypes.c_void_p)


def _numpys_blas() -> bytes | None:
    """The path of the OpenBLAS NumPy has loaded into this process (numba imports NumPy, which loads it), asked of
    the dynamic linker (no file is read: the library is mapped already), or None."""
    found: list[bytes] = []

    def visit(info: Any, size: int, data: Any) -> int:
        path = info.contents.path or b""
        if _LIBRARY in path.rpartition(b"/")[2]:
            found.append(path)
        return 0

    try:
        ctypes.CDLL(None).dl_iterate_phdr(_VISIT(visit), None)
    except AttributeError:  # not glibc
        return None
    return found[0] if found else None


def _register() -> bool:
    """Give the four routines' addresses in NumPy's OpenBLAS to LLVM."""
    path = _numpys_blas()
    if path is None:
        return False
    try:
        lib = ctypes.CDLL(path.decode())  # the loaded library's handle
        addresses = [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _NAMES]
    except (OSError, AttributeError):
        return False
    for name, address in zip(_NAMES, addresses, strict=True):
        llvm.add_symbol(name, address)
    return True


AVAILABLE = _register()

_i64 = types.int64


def _routines(t: Any) -> tuple[Any, Any]:
    p = types.CPointer(t)
    prefix = "scipy_cblas_s" if t == types.float32 else "scipy_cblas_d"
    dot = types.ExternalFunction(prefix + "dot64_", t(_i64, p, _i64, p, _i64))
    gemv_sig = types.void(types.int32, types.int32, _i64, _i64, t, p, _i64, p, _i64, t, p, _i64)
    return dot, types.ExternalFunction(prefix + "gemv64_", gemv_sig)


sdot, sgemv = _routines(types.float32)
ddot, dgemv = _routines(types.float64)
