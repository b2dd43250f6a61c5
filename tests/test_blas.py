"""The kernels' matrix-vector products are NumPy's own, bit for bit (plugins/blas.py): float32 products round a
row by the rows batched with it, so only the same routine called the same way gives the same floats."""

from __future__ import annotations

import numpy as np
import pytest

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
