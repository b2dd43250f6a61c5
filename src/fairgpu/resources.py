"""Resource names, units, Kubernetes quantity parsing and the fairness resource vector.

Units inside fairgpu: gpu in devices, gpucores in percent of one GPU, gpumem in MiB, cpu in millicores,
memory in MiB. Fair shares are vectors over FAIR_DIMS, where "gpu" counts GPU-equivalents (a fractional
pod holding 30 % of one GPU's cores counts 0.3).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

import numpy as np

from fairgpu.errors import QuantityError

GPU = "nvidia.com/gpu"
GPUCORES = "nvidia.com/gpucores"
GPUMEM = "nvidia.com/gpumem"
GPUMEM_PCT = "nvidia.com/gpumem-percentage"
CPU = "cpu"
MEMORY = "memory"
POD_RESOURCES = (GPU, GPUCORES, GPUMEM, GPUMEM_PCT, CPU, MEMORY)

FAIR_DIMS = ("gpu", "gpumem", "cpu", "memory")
DIM_GPU, DIM_GPUMEM, DIM_CPU, DIM_MEMORY = range(4)
# Names a queue's guaranteed/limit may use, and how each maps onto a fair dimension.
QUOTA_RESOURCES = (GPU, GPUCORES, GPUMEM, CPU, MEMORY)

MIB = 1 << 20
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1)}
_DECIMAL |= {"k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12)}
_DECIMAL |= {"P": Decimal(10**15), "E": Decimal(10**18)}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$")


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity ("500m", "64Gi", "1.5", "2e3") into an exact Decimal."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int | float):
        if isinstance(value, float) and not np.isfinite(value):
            raise QuantityError(f"{value!r} is not a finite quantity")
        return Decimal(str(value))
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise QuantityError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 64Gi, 1.5, 2e3)")
    number, exponent, suffix = match.groups()
    try:
        base = Decimal(number)
    except InvalidOperation as err:  # pragma: no cover - the regex admits only valid numbers
        raise QuantityError(f"{value!r} is not a number") from err
    if exponent:
        return base * (Decimal(10) ** int(exponent[1:]))
    if suffix in _BINARY:
        return base * _BINARY[suffix]
    return base * _DECIMAL[suffix or ""]


def cpu_millicores(value: str | int | float) -> int:
    """CPU quantity to millicores, rounded up as Kubernetes does."""
    return _ceil_nonneg(parse_quantity(value) * 1000, value)


def memory_mib(value: str | int | float) -> int:
    """Byte quantity ("64Gi", "1e9") to MiB, rounded up."""
    return _ceil_nonneg(parse_quantity(value) / MIB, value)


def gpumem_mib(value: str | int | float) -> int:
    """HAMi's nvidia.com/gpumem: a plain number is MiB; a suffixed quantity is bytes."""
    match = _QUANTITY.match(value.strip()) if isinstance(value, str) else None
    if match and match.group(3):
        return memory_mib(value)
    return _ceil_nonneg(parse_quantity(value), value)


def count(value: str | int | float) -> int:
    """A whole count (GPUs, percent): must be a non-negative integer."""
    q = parse_quantity(value)
    if q < 0 or q != q.to_integral_value():
        raise QuantityError(f"{value!r} must be a whole non-negative number")
    return int(q)


def _ceil_nonneg(q: Decimal, original: object) -> int:
    if q < 0:
        raise QuantityError(f"{original!r} must not be negative")
    return int(q.to_integral_value(rounding="ROUND_CEILING"))


def zeros() -> np.ndarray:
    return np.zeros(len(FAIR_DIMS), dtype=np.float64)


def quota_vector(spec: Mapping[str, str | int | float], *, default: float) -> np.ndarray:
    """A queue's guaranteed/limit mapping to a fair vector; unnamed dimensions take `default`.

    gpucores counts as GPU-equivalents (cores/100), so a quota can be given in either unit.
    """
    if GPU in spec and GPUCORES in spec:
        raise QuantityError(f"give {GPU} or {GPUCORES}, not both (they measure the same GPUs)")
    vec = np.full(len(FAIR_DIMS), default, dtype=np.float64)
    for name, raw in spec.items():
        if name == GPU:
            amount = float(parse_quantity(raw))
        elif name == GPUCORES:
            amount = float(parse_quantity(raw)) / 100.0
        elif name == GPUMEM:
            vec[DIM_GPUMEM] = gpumem_mib(raw)
            continue
        elif name == CPU:
            vec[DIM_CPU] = cpu_millicores(raw)
            continue
        elif name == MEMORY:
            vec[DIM_MEMORY] = memory_mib(raw)
            continue
        else:
            raise QuantityError(f"unknown resource {name!r} (expected one of {', '.join(QUOTA_RESOURCES)})")
        if amount < 0:
            raise QuantityError(f"{name}: {raw!r} must not be negative")
        vec[DIM_GPU] = amount
    return vec
