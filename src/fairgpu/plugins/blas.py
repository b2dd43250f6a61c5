"""NumPy's own matrix-vector products and `exp`, callable from compiled kernels.

`matrix @ w` in float32 (OpenBLAS's sgemv) rounds a row by the rows batched with it, and by a different
summation than any loop of ours, so a kernel cannot recompute it; it can call the very routines NumPy calls.
NumPy's wheels carry OpenBLAS (`numpy.libs/libscipy_openblas64_*.so`, loaded with NumPy): its matmul of a
C-contiguous (m, T) matrix by a (T,) vector is `cblas_?dot` for one row and `cblas_?gemv` (column-major,
transposed) for more (tests/test_blas.py checks the results bit for bit against `@`). The symbols are
registered with LLVM by name, so kernels calling them stay cacheable (the kernels calling them,
`fragmentation_kernels.matvec32` and `matvec64`, live beside their callers: numba's disk cache notices a
change in a kernel's own file, not in another module's). `AVAILABLE` is False where NumPy has no
such library (another build, another C library): the plugins then run their NumPy path.

The same holds for `np.exp` on float64 (AVX-512 SIMD where the CPU has it: numba's `exp`, the C library's,
rounds 92,475 of 2,000,000 values otherwise): `exp_in_place` calls the very loop NumPy chose for it at import,
as NumPy's own documented low-level access to ufunc loops gives it (`ufunc._get_strided_loop`).

OpenBLAS runs on one thread in this process (`threadpool_limits` below): the engine's products are a few
thousand rows each, where its worker threads cost more CPU than they save, and with the other cores busy a
product waits for a descheduled worker. At 10,000 nodes (`bench/engine_throughput.py`): 8,147 → 11,673
placements per CPU-second, wall p99 3.7 → 0.76 ms. Both paths, compiled and NumPy's, call it alike.
"""

from __future__ import annotations

import ctypes
from typing import Any

import llvmlite.binding as llvm  # type: ignore[import-untyped]  # llvmlite ships no type information
import numba
import numpy as np
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]  # ships no type information

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


_EXP = "fairgpu_numpy_exp_f8"
_CALL_INFO = b"numpy_1.24_ufunc_call_info"


def _numpys_exp(exp: Any = np.exp) -> tuple[Any, np.ndarray] | None:
    """NumPy's strided loop of `exp` on contiguous float64 (0 on success), given to LLVM by name, and the
    (context, auxdata) pointers it is called with, valid while the capsule that holds them lives (kept with
    them); None where NumPy lacks that API (experimental, so not in its type stubs: `exp` is Any) or its
    loop needs the interpreter."""
    try:
        _, info = exp._resolve_dtypes_and_context((np.dtype(np.float64), np.dtype(np.float64)))
        exp._get_strided_loop(info, fixed_strides=(8, 8))
        pointer = ctypes.pythonapi.PyCapsule_GetPointer
        pointer.restype, pointer.argtypes = ctypes.c_void_p, (ctypes.py_object, ctypes.c_char_p)
        head = ctypes.cast(pointer(info, _CALL_INFO), ctypes.POINTER(ctypes.c_void_p))
    except (AttributeError, TypeError, ValueError):
        return None
    loop, context, auxdata = head[0], head[1] or 0, head[2] or 0
    needs_python = ctypes.cast(head, ctypes.POINTER(ctypes.c_ubyte))[3 * ctypes.sizeof(ctypes.c_void_p)]
    if not loop or needs_python:
        return None
    llvm.add_symbol(_EXP, loop)
    return info, np.array([context, auxdata], dtype=np.int64)


threadpool_limits(1, user_api="blas")  # for the process, from now on (the module's docstring says why)
_exp = _numpys_exp()
# `exp_in_place`'s second argument: pass it along to the kernels that call it (a kernel cached on disk cannot
# hold a pointer of this process as a constant)
EXP_CALL = np.zeros(2, dtype=np.int64) if _exp is None else _exp[1]
AVAILABLE = _register() and _exp is not None

_i64 = types.int64


def _routines(t: Any) -> tuple[Any, Any]:
    p = types.CPointer(t)
    prefix = "scipy_cblas_s" if t == types.float32 else "scipy_cblas_d"
    dot = types.ExternalFunction(prefix + "dot64_", t(_i64, p, _i64, p, _i64))
    gemv_sig = types.void(types.int32, types.int32, _i64, _i64, t, p, _i64, p, _i64, t, p, _i64)
    return dot, types.ExternalFunction(prefix + "gemv64_", gemv_sig)


sdot, sgemv = _routines(types.float32)
ddot, dgemv = _routines(types.float64)
# int loop(PyArrayMethod_Context *, char *const *data, const npy_intp *dimensions, const npy_intp *strides,
# NpyAuxData *): the pointers NumPy keeps as integers (the same registers)
exp_loop = types.ExternalFunction(_EXP, types.int32(_i64, types.voidptr, types.voidptr, types.voidptr, _i64))
