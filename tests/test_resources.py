"""Kubernetes quantity parsing, unit conversions and queue quota vectors (fairgpu.resources)."""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairgpu import resources as r
from fairgpu.errors import QuantityError
from fairgpu.resources import count, cpu_millicores, gpumem_mib, memory_mib, parse_quantity, quota_vector

FAST = settings(max_examples=150, deadline=None)

# -- parse_quantity -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", Decimal(0)),
        ("1", Decimal(1)),
        ("1.5", Decimal("1.5")),
        (".5", Decimal("0.5")),
        ("5.", Decimal(5)),
        ("+3", Decimal(3)),
        ("-2", Decimal(-2)),
        ("500m", Decimal("0.5")),
        ("250u", Decimal("0.00025")),
        ("7n", Decimal("7e-9")),
        ("2k", Decimal(2000)),
        ("3M", Decimal(3_000_000)),
        ("1G", Decimal(10**9)),
        ("1T", Decimal(10**12)),
        ("1P", Decimal(10**15)),
        ("1E", Decimal(10**18)),  # "E" alone is the exa suffix, not an exponent
        ("1Ki", Decimal(1024)),
        ("64Mi", Decimal(64 * 2**20)),
        ("64Gi", Decimal(64 * 2**30)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("2Ti", Decimal(2 * 2**40)),
        ("1Pi", Decimal(2**50)),
        ("1Ei", Decimal(2**60)),
        ("2e3", Decimal(2000)),
        ("2E3", Decimal(2000)),
        ("1e-3", Decimal("0.001")),
        ("1.5e+2", Decimal(150)),
        (" 4Gi ", Decimal(4 * 2**30)),
    ],
)
def test_parse_quantity_strings(text: str, expected: Decimal) -> None:
    assert parse_quantity(text) == expected


def test_parse_quantity_numbers() -> None:
    assert parse_quantity(3) == 3
    assert parse_quantity(0.25) == Decimal("0.25")
    assert isinstance(parse_quantity("1"), Decimal)


@pytest.mark.parametrize(
    "bad",
    ["", " ", "abc", "Gi", "1.2.3", "1 Gi", "1gi", "1KiB", "1K", "1e", "1e3Gi", "--1", "0x10", "1,5", "m"],
)
def test_parse_quantity_rejects_garbage(bad: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), True, False])
def test_parse_quantity_rejects_non_finite_and_bool(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)  # type: ignore[arg-type]


def test_quantity_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="Kubernetes quantity"):
        parse_quantity("lots")


@FAST
@given(
    n=st.integers(0, 10**6),
    suffix=st.sampled_from(["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]),
)
def test_binary_suffixes_are_powers_of_1024(n: int, suffix: str) -> None:
    power = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"].index(suffix) + 1
    assert parse_quantity(f"{n}{suffix}") == n * 1024**power


@FAST
@given(n=st.integers(-(10**9), 10**9), exp=st.integers(-6, 12))
def test_exponent_form_matches_decimal(n: int, exp: int) -> None:
    assert parse_quantity(f"{n}e{exp}") == Decimal(n) * Decimal(10) ** exp


# -- cpu_millicores -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", 1000),
        ("500m", 500),
        ("0.1", 100),
        ("1.5", 1500),
        ("2e3", 2_000_000),
        ("1k", 1_000_000),
        (2, 2000),
        (0.25, 250),
        ("0", 0),
        ("1.0001", 1001),  # rounded up, as Kubernetes does
        ("1n", 1),
        ("0.5m", 1),
    ],
)
def test_cpu_millicores(value: object, expected: int) -> None:
    assert cpu_millicores(value) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["-1", "-500m", -1, "one"])
def test_cpu_millicores_rejects_negative_and_garbage(bad: object) -> None:
    with pytest.raises(QuantityError):
        cpu_millicores(bad)  # type: ignore[arg-type]


@FAST
@given(st.decimals(min_value=0, max_value=10**6, places=6, allow_nan=False, allow_infinity=False))
def test_cpu_millicores_is_the_ceiling(value: Decimal) -> None:
    milli = cpu_millicores(str(value))
    assert milli >= value * 1000
    assert milli - 1 < value * 1000


@FAST
@given(st.integers(0, 10**9))
def test_cpu_millicores_round_trips_m_suffix(n: int) -> None:
    assert cpu_millicores(f"{n}m") == n


# -- memory_mib -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("64Gi", 65536),
        ("1Mi", 1),
        ("1536Ki", 2),  # 1.5 MiB rounds up
        ("1Ki", 1),
        ("1", 1),  # one byte still takes a MiB
        ("0", 0),
        ("1e9", 954),  # 953.67 MiB, rounded up
        ("1G", 954),
        ("2Ti", 2 * 1024 * 1024),
        (1 << 20, 1),
    ],
)
def test_memory_mib(value: object, expected: int) -> None:
    assert memory_mib(value) == expected  # type: ignore[arg-type]


def test_memory_mib_rejects_negative() -> None:
    with pytest.raises(QuantityError, match="negative"):
        memory_mib("-1Gi")


@FAST
@given(st.integers(0, 10**12))
def test_memory_mib_is_ceiling_of_bytes(nbytes: int) -> None:
    assert memory_mib(str(nbytes)) == math.ceil(nbytes / 2**20)


# -- gpumem_mib ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("4096", 4096),  # a plain number is MiB (HAMi)
        (4096, 4096),
        ("2e3", 2000),  # an exponent is still a plain number
        ("1.5", 2),  # rounded up
        ("4Gi", 4096),  # a suffixed quantity is bytes
        ("512Mi", 512),
        ("1G", 954),
        ("1k", 1),  # 1000 bytes
        ("0", 0),
    ],
)
def test_gpumem_mib(value: object, expected: int) -> None:
    assert gpumem_mib(value) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["-1", "-1Gi", "4 GiB", "lots"])
def test_gpumem_mib_rejects(bad: str) -> None:
    with pytest.raises(QuantityError):
        gpumem_mib(bad)


@FAST
@given(st.integers(0, 10**7))
def test_gpumem_plain_and_mi_agree(n: int) -> None:
    assert gpumem_mib(str(n)) == gpumem_mib(f"{n}Mi") == n


# -- count ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [("0", 0), ("3", 3), (8, 8), ("1k", 1000), ("2.0", 2), ("1e2", 100)])
def test_count(value: object, expected: int) -> None:
    got = count(value)  # type: ignore[arg-type]
    assert got == expected
    assert isinstance(got, int)


@pytest.mark.parametrize("bad", ["1.5", "500m", "-1", -2, 0.5, "two"])
def test_count_rejects_fractions_and_negatives(bad: object) -> None:
    with pytest.raises(QuantityError):
        count(bad)  # type: ignore[arg-type]


# -- quota_vector --------------------------------------------------------------------------------------------


def test_quota_vector_converts_every_dimension() -> None:
    vec = quota_vector({r.GPU: "2", r.GPUMEM: "16Gi", r.CPU: "4", r.MEMORY: "8Gi"}, default=np.inf)
    assert vec.tolist() == [2.0, 16384.0, 4000.0, 8192.0]
    assert vec.dtype == np.float64
    assert len(vec) == len(r.FAIR_DIMS)


def test_quota_vector_unnamed_dimensions_take_default() -> None:
    assert quota_vector({r.GPU: 4}, default=np.inf).tolist() == [4.0, np.inf, np.inf, np.inf]
    assert quota_vector({r.CPU: "500m"}, default=0.0).tolist() == [0.0, 0.0, 500.0, 0.0]
    assert quota_vector({}, default=7.0).tolist() == [7.0] * 4


def test_quota_vector_plain_gpumem_is_mib() -> None:
    assert quota_vector({r.GPUMEM: 40960}, default=0.0)[r.DIM_GPUMEM] == 40960


@pytest.mark.parametrize(("cores", "gpus"), [(250, 2.5), ("100", 1.0), (30, 0.3), (0, 0.0)])
def test_quota_vector_gpucores_count_as_gpu_hundredths(cores: object, gpus: float) -> None:
    vec = quota_vector({r.GPUCORES: cores}, default=0.0)  # type: ignore[dict-item]
    assert vec[r.DIM_GPU] == pytest.approx(gpus)
    assert vec[[r.DIM_GPUMEM, r.DIM_CPU, r.DIM_MEMORY]].tolist() == [0.0, 0.0, 0.0]


def test_quota_vector_fractional_gpu_allowed() -> None:
    assert quota_vector({r.GPU: "1.5"}, default=0.0)[r.DIM_GPU] == 1.5


def test_quota_vector_rejects_gpu_and_gpucores_together() -> None:
    with pytest.raises(QuantityError, match="not both"):
        quota_vector({r.GPU: 1, r.GPUCORES: 100}, default=0.0)


@pytest.mark.parametrize("name", ["foo", "nvidia.com/gpumem-percentage", "GPU", "ephemeral-storage"])
def test_quota_vector_rejects_unknown_names(name: str) -> None:
    with pytest.raises(QuantityError, match="unknown resource"):
        quota_vector({name: 1}, default=0.0)


@pytest.mark.parametrize(
    "spec",
    [{r.GPU: "-1"}, {r.GPUCORES: -50}, {r.CPU: "-1"}, {r.MEMORY: "-1Gi"}, {r.GPUMEM: "-5"}],
)
def test_quota_vector_rejects_negative(spec: dict) -> None:
    with pytest.raises(QuantityError):
        quota_vector(spec, default=0.0)


def test_quota_vector_rejects_bad_quantity() -> None:
    with pytest.raises(QuantityError):
        quota_vector({r.CPU: "four"}, default=0.0)
