"""What both drivers parse from users, driver-neutral: the queue schema (a scenario's `queues:` entries and
the Queue custom resource's spec validate with the same model, so a queue means the same in the simulator
and in the cluster), durations, and one way to turn a pydantic error into a line naming the field."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fairgpu import resources as r
from fairgpu.errors import InputError, QuantityError, RequestError, ScenarioError
from fairgpu.model import QueueSpec
from fairgpu.model.queue import NEVER, PreemptionPolicy

# Go's time.ParseDuration style, plus days: "90s", "1h30m", "2d12h", "1.5h"
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|[smhd]))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|[smhd])")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: str | int | float) -> float:
    """Seconds from a number of seconds or a Go-style duration: "30s", "10m", "1h30m", "2d"."""
    if isinstance(value, bool):
        raise InputError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = str(value).strip().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            if not _DURATION.match(text):
                raise InputError(f"{value!r} is not a duration (seconds, or e.g. 30s, 10m, 1h30m, 2d)") from None
            seconds = sum(float(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(text))
    if not np.isfinite(seconds) or seconds < 0:
        raise InputError(f"{value!r} must be a non-negative duration")
    return seconds


def format_duration(seconds: float) -> str:
    """ "1h30m", "2d4h", "45s": what parse_duration reads back, to the second."""
    left = round(seconds)
    if left == 0:
        return "0s" if seconds == 0 else f"{seconds:.3g}s"
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            out += f"{left // size}{unit}"
            left %= size
    return out


def require_memory_unit(value: str | int | float) -> None:
    """A bare number of bytes is almost always a mistake for MiB or GiB: ask for the unit."""
    if isinstance(value, bool):
        return
    text = str(value).strip()
    if re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)", text) and float(text) != 0:
        raise QuantityError(f"{value!r} needs a unit (e.g. {text}Mi or {text}Gi); a bare number would be bytes")


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, list | dict):
                continue  # unhashable: let the base class report it
            if key in seen:
                raise ScenarioError(f"line {key_node.start_mark.line + 1}: key {key!r} is given twice")
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_yaml(text: str, source: str) -> Any:
    """YAML from a user's file: duplicate keys refused; errors are a ScenarioError naming source and line."""
    return _load(lambda: yaml.load(text, Loader=_UniqueKeyLoader), source)


def load_yaml_all(text: str, source: str) -> list[Any]:
    """Every document of a multi-document YAML file, as load_yaml reads one."""
    return _load(lambda: list(yaml.load_all(text, Loader=_UniqueKeyLoader)), source)


def _load(read: Any, source: str) -> Any:
    try:
        return read()
    except ScenarioError as err:
        raise ScenarioError(f"{source}: {err}") from None
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" at line {where.line + 1}" if where else ""
        raise ScenarioError(f"{source}: not valid YAML{line}") from err


Quantity = str | int | float


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PreemptionDoc(Strict):
    reclaim: bool = True
    fair_share: bool = False
    within_queue: Literal["Never", "LowerPriority"] = "Never"
    min_runtime: Quantity = 0
    grace_period: Quantity = 0
    fair_share_max_runtime: Quantity | None = None  # None: fair share may evict work however long it ran

    @field_validator("min_runtime", "grace_period", "fair_share_max_runtime")
    @classmethod
    def _duration(cls, v: Quantity | None) -> Quantity | None:
        if v is not None:
            parse_duration(v)
        return v


class QueueDoc(Strict):
    name: str = Field(min_length=1)
    weight: float = Field(default=1.0, gt=0)
    guaranteed: dict[str, Quantity] = Field(default_factory=dict)
    limit: dict[str, Quantity] = Field(default_factory=dict)
    parent: str | None = None
    usage_half_life: Quantity = 0
    fair_within: Literal["fifo", "users"] = "fifo"
    starvation_after: Quantity = "10m"
    lendable: dict[str, Quantity] | None = None  # default: all of the guarantee
    allocation: Literal["dynamic", "static"] = "dynamic"
    preemption: Literal["never"] | PreemptionDoc = Field(default_factory=lambda: PreemptionDoc())

    @field_validator("usage_half_life", "starvation_after")
    @classmethod
    def _queue_duration(cls, v: Quantity) -> Quantity:
        parse_duration(v)
        return v

    @field_validator("guaranteed", "limit", "lendable")
    @classmethod
    def _vector(cls, v: dict[str, Quantity] | None) -> dict[str, Quantity] | None:
        if v is not None:
            if r.MEMORY in v:
                require_memory_unit(v[r.MEMORY])
            r.quota_vector(v, default=0.0)
        return v

    def to_spec(self, name: str | None = None) -> QueueSpec:
        """The engine's QueueSpec (the Queue custom resource uses this too, with its metadata.name)."""
        guaranteed = r.quota_vector(self.guaranteed, default=np.inf) if self.guaranteed else r.zeros()
        return QueueSpec(
            name or self.name,
            self.weight,
            guaranteed,
            r.quota_vector(self.limit, default=np.inf),
            self.parent,
            usage_half_life=parse_duration(self.usage_half_life),
            fair_within=self.fair_within,
            starvation_after=parse_duration(self.starvation_after),
            lendable=None if self.lendable is None else r.quota_vector(self.lendable, default=np.inf),
            allocation=self.allocation,
            preemption=self.policy(),
        )

    def policy(self) -> PreemptionPolicy:
        if self.preemption == "never":
            return NEVER
        p = self.preemption
        bound = p.fair_share_max_runtime
        return PreemptionPolicy(
            reclaim=p.reclaim,
            fair_share=p.fair_share,
            within_queue=p.within_queue,
            min_runtime=parse_duration(p.min_runtime),
            grace_period=parse_duration(p.grace_period),
            fair_share_max_runtime=math.inf if bound is None else parse_duration(bound),
        )


def field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _union_tag(part: object) -> bool:
    """A part of an error's location that names a member of a union, not a key the user wrote."""
    return part in ("str", "int", "float", "PreemptionDoc") or (isinstance(part, str) and part.startswith("literal["))


def validation_message(err: ValidationError) -> str:
    errors = err.errors()
    e = errors[0]
    tag = next((i for i, part in enumerate(e["loc"]) if isinstance(part, str) and part.startswith("literal[")), None)
    if tag is not None:  # `never` or a map (preemption): a map's fault is in the map, not in not being `never`
        e = next((x for x in errors[1:] if x["loc"][:tag] == e["loc"][:tag] and x["type"] != "model_type"), e)
    msg = e["msg"].removeprefix("Value error, ")
    loc = tuple(p for p in e["loc"] if not _union_tag(p))
    cause = e.get("ctx", {}).get("error")
    if isinstance(cause, RequestError) and cause.field:  # the fault is in one resource of the mapping
        loc, msg = (*loc, cause.field), cause.problem
    if e["type"] == "extra_forbidden":
        return f"{field_path(loc)}: unknown key"
    if e["type"] == "missing":
        return f"{field_path(loc)}: required key is missing"
    return f"{field_path(loc)}: {msg}" if loc else msg
