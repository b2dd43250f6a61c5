"""The kernels' matrix-vector products are NumPy's own, bit for bit (plugins/blas.py): float32 products round a
row by the rows batched with it, so only the same routine called the same way gives the same floats."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from fairgpu.plugins import blas
from fairgpu.plugins import fragmentation_kernels as kernels

pytestmark = pytest.mark.skipif(not blas.AVAILABLE, reason="NumPy without its bundled OpenBLAS")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_products_equal_numpys_bit_for_bit(dtype: type) -> None:
    rng = np.random.default_rng(7)
    product = kernels.matvec32 if dtype is np.float32 else kernels.matvec64
    differ = rows = 0
    for shapes in (1, 2, 5, 17, 41, 49, 64, 130):
        for m in (0, 1, 2, 3, 4, 5, 7, 8, 9, 33, 1000):
            # sums of free GPU cores where a shape fits (integers, many zeros) and weights of a few magnitudes
            a = (rng.integers(0, 800, (m, shapes)) * (rng.random((m, shapes)) < 0.7)).astype(dtype)
            w = (rng.random(shapes) / shapes * rng.choice([1, 2, 4, 16], shapes)).astype(np.float32)
            got = product(a, w.astype(dtype))
            assert got.dtype == dtype and got.shape == (m,)
            differ += int((got != a @ w.astype(dtype)).sum())
            rows += m
    assert differ == 0 and rows > 8000


def test_without_numpys_blas_the_plugin_runs_its_numpy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels link to NumPy's OpenBLAS by name: where it is missing they must not be called at all."""
    from fairgpu.plugins.fragmentation import Fragmentation

    monkeypatch.setattr(blas, "AVAILABLE", False)
    assert not Fragmentation(compiled=True).compiled


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_changed_node_against_a_mix_of_one_shape_is_its_product(dtype: type) -> None:
    """The smallest product the upkeep asks for (one node changed, one shape learned so far): a 1 × 1 matrix,
    which NumPy computes as a dot product of length one."""
    product = kernels.matvec32 if dtype is np.float32 else kernels.matvec64
    a, w = np.array([[300.0]], dtype=dtype), np.array([0.5], dtype=dtype)
    assert product(a, w).tolist() == (a @ w).tolist() == [150.0]


def test_where_numpy_has_no_openblas_or_it_lacks_the_routines_the_kernels_are_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`AVAILABLE` is False where the dynamic linker finds no OpenBLAS of NumPy's, or one without the four
    routines (another build): the plugins then run their NumPy path instead of calling symbols never given."""
    monkeypatch.setattr(blas, "_numpys_blas", lambda: None)
    assert blas._register() is False
    monkeypatch.setattr(blas, "_numpys_blas", lambda: b"libc.so.6")  # loaded, but no cblas routines in it
    assert blas._register() is False


def test_the_kernels_exp_is_numpys_bit_for_bit() -> None:
    """`exp_in_place` calls NumPy's own float64 loop: the same bits as `np.exp` on FGD's exponents (±50) at every
    length and offset (SIMD bodies and tails), where numba's `exp` (the C library's) rounds otherwise."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-50, 50, 200_000), rng.uniform(-1, 1, 50_000), [-50.0, 0.0, 50.0]])
    got = x.copy()
    kernels.exp_in_place(got, blas.EXP_CALL)
    assert np.array_equal(got, np.exp(x))
    for n in range(20):
        part = x[7 : 7 + n].copy()
        kernels.exp_in_place(part, blas.EXP_CALL)
        assert np.array_equal(part, np.exp(x[7 : 7 + n]))
    assert (numbas_exp(x) != np.exp(x)).any()  # the reason for the call: a kernel's own exp is not NumPy's


@njit(cache=True)
def numbas_exp(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = np.exp(x[i])
    return out


def test_without_numpys_ufunc_loop_api_the_kernels_are_not_used() -> None:
    """A NumPy without `ufunc._get_strided_loop` (or another object) gives no loop to call: `AVAILABLE` then
    leaves the plugins on their NumPy path."""
    assert blas._numpys_exp(lambda x: x) is None
    assert blas._numpys_exp(np.add) is None  # a loop, but of two inputs: refused before any pointer is read


def test_the_compiled_gpu_order_sorts_as_lexsort() -> None:
    """By the change, equal changes by free cores, equal both in the order given: np.lexsort's stable order, on
    few slots with many ties (dropping the tie-break or the stability fails it)."""
    rng = np.random.default_rng(5)
    for _ in range(500):
        m = int(rng.integers(1, 9))
        slots = rng.permutation(8)[:m]
        delta = rng.choice([-1.5, 0.0, 2.0, np.float64(2.0000000000000004)], m)
        free = rng.choice([0, 30, 100], 8)
        want = slots[np.lexsort((free[slots], delta))]
        assert np.array_equal(kernels.lexsorted(slots, delta.copy(), free), want)


def test_numpys_openblas_runs_on_one_thread_once_the_engine_is_loaded() -> None:
    """Its worker threads cost more CPU than they save on the engine's products and stall a decision when the
    other cores are busy (blas.py): loading the kernels' BLAS sets one thread for the process."""
    from threadpoolctl import threadpool_info  # type: ignore[import-untyped]

    pools = [p for p in threadpool_info() if p["internal_api"] == "openblas"]
    assert pools and all(p["num_threads"] == 1 for p in pools), pools
