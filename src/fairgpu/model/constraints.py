"""Where a pod may run beyond its resources: node affinity expressions, taints and tolerations, and HAMi's
per-pod placement policies. Plain frozen data, so PodSpec stays hashable."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal, get_args

from fairgpu.errors import InputError

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
OPERATORS: tuple[str, ...] = get_args(Operator)
TaintEffect = Literal["NoSchedule", "NoExecute", "PreferNoSchedule"]
TAINT_EFFECTS: tuple[str, ...] = get_args(TaintEffect)
# Taint effects that keep new pods off a node; PreferNoSchedule is only a preference.
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
Policy = Literal["binpack", "spread"]  # hami.io/node-scheduler-policy, hami.io/gpu-scheduler-policy
POLICIES: tuple[str, ...] = get_args(Policy)
# Every name HAMi v2.10 gives hami.io/gpu-scheduler-policy, alone or comma-chained (`binpack,numa`).
GPU_POLICY_NAMES = (*POLICIES, "mutex", "topology-aware", "numa")
GPU_SORT_KEYS = ("binpack", "spread", "numa")  # HAMi's gpuSortKeyOrder: the chain names that order cards
DEFAULT_WEIGHTS = (1, 1, 1)  # hami.io/device-scoring-weights unset: slot, core, memory


def gpu_policy_names(value: str) -> tuple[str, ...]:
    """The names of a hami.io/gpu-scheduler-policy value, each trimmed as HAMi's PolicyContains trims it.
    Raises ValueError for a name HAMi does not know (HAMi ignores it; fairgpu says so rather than guess)."""
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in GPU_POLICY_NAMES]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not one of {', '.join(GPU_POLICY_NAMES)}")
    return names


def gpu_sort_chain(value: str, numa_bind: bool) -> tuple[str, ...] | None:
    """HAMi's card order keys for a chained policy (pkg/scheduler/policy/gpu_policy.go `lessByChain`): the
    binpack/spread/numa names in the order written, deduplicated, spread when none, numa first under
    numa-bind. None when HAMi reads the value as a single policy: no comma and not bare `numa`."""
    if "," not in value and value != "numa":
        return None
    chain: list[str] = []
    for name in value.split(","):
        if name.strip() in GPU_SORT_KEYS and name.strip() not in chain:
            chain.append(name.strip())
    chain = chain or ["spread"]
    if numa_bind and chain[0] != "numa":
        chain = ["numa", *(k for k in chain if k != "numa")]
    return tuple(chain)


def scoring_weights(value: str) -> tuple[int, int, int]:
    """hami.io/device-scoring-weights (`slot=1,core=1,memory=3`) as HAMi's ParseDeviceScoringWeights reads it
    (pkg/util/device_scoring_weights.go): exactly the three keys, non-negative integers, one positive.
    Raises ValueError with HAMi's reason, quoted as Go's %q quotes."""
    q = json.dumps
    parts = value.split(",")
    if len(parts) != 3:
        raise ValueError(f"{q(value)}: expected slot, core, and memory weights")
    weights: dict[str, int] = {}
    for part in parts:
        key, eq, raw = part.strip().partition("=")
        if not eq:
            raise ValueError(f"{q(value)}: expected key=value entries")
        key = key.strip()
        if key in weights:
            raise ValueError(f"{q(value)}: duplicate {q(key)} weight")
        text = raw.strip()
        if not re.fullmatch(r"[+-]?[0-9]+", text) or not -(2**63) <= int(text) < 2**63:
            raise ValueError(f"{q(value)}: {q(key)} weight must be an integer")
        if int(text) < 0:
            raise ValueError(f"{q(value)}: {q(key)} weight must not be negative")
        if key not in ("slot", "core", "memory"):
            raise ValueError(f"{q(value)}: unknown weight {q(key)}")
        weights[key] = int(text)
    if not any(weights.values()):
        raise ValueError(f"{q(value)}: at least one weight must be positive")
    return weights["slot"], weights["core"], weights["memory"]


@dataclass(slots=True, frozen=True)
class MatchExpression:
    """One requirement of a nodeSelectorTerm (requiredDuringSchedulingIgnoredDuringExecution)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.operator not in OPERATORS:
            raise InputError(f"operator: {self.operator!r} is not one of {', '.join(OPERATORS)}")
        if self.operator in ("In", "NotIn") and not self.values:
            raise InputError(f"values: {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise InputError(f"values: {self.operator} takes no values")
        if self.operator in ("Gt", "Lt") and (len(self.values) != 1 or _integer(self.values[0]) is None):
            raise InputError(f"values: {self.operator} needs exactly one integer value")

    def matches(self, labels: dict[str, str]) -> bool:
        """Kubernetes semantics: NotIn and DoesNotExist hold on nodes without the label."""
        value = labels.get(self.key)
        if self.operator == "In":
            return value in self.values
        if self.operator == "NotIn":
            return value not in self.values
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        have, bound = _integer(value), int(self.values[0])
        if have is None:
            return False
        return have > bound if self.operator == "Gt" else have < bound


def _integer(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@dataclass(slots=True, frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __post_init__(self) -> None:
        if not self.key:
            raise InputError("key: a taint needs a key")
        if self.effect not in TAINT_EFFECTS:
            raise InputError(f"effect: {self.effect!r} is not one of {', '.join(TAINT_EFFECTS)}")


@dataclass(slots=True, frozen=True)
class Toleration:
    """operator Equal (key and value must match) or Exists (any value; an empty key tolerates every taint);
    an empty effect matches every effect."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def __post_init__(self) -> None:
        if self.operator not in ("Equal", "Exists"):
            raise InputError(f"operator: {self.operator!r} is not Equal or Exists")
        if self.operator == "Exists" and self.value:
            raise InputError("value: operator Exists takes no value")
        if self.operator == "Equal" and not self.key:
            raise InputError("key: operator Equal needs a key")
        if self.effect and self.effect not in TAINT_EFFECTS:
            raise InputError(f"effect: {self.effect!r} is not one of {', '.join(TAINT_EFFECTS)}")

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value
