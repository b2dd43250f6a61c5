"""What both drivers parse from users, driver-neutral: the queue schema (a scenario's `queues:` entries and
the Queue custom resource's spec validate with the same model, so a queue means the same in the simulator
and in the cluster), durations, and one way to turn a pydantic error into a line naming the field."""

from __future__ import annotations

import re
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fairgpu import resources as r
from fairgpu.errors import InputError, RequestError
from fairgpu.model import QueueSpec
from fairgpu.model.queue import NEVER, PreemptionPolicy

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: str | int | float) -> float:
    """Seconds from a number or "30s", "10m", "8h", "2d"."""
    if isinstance(value, bool):
        raise InputError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise InputError(f"{value!r} is not a duration (seconds, or e.g. 30s, 10m, 8h, 2d)")
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if not np.isfinite(seconds) or seconds < 0:
        raise InputError(f"{value!r} must be a non-negative duration")
    return seconds


Quantity = str | int | float


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PreemptionDoc(Strict):
    reclaim: bool = True
    fair_share: bool = False
    within_queue: Literal["Never", "LowerPriority"] = "Never"
    min_runtime: Quantity = 0
    grace_period: Quantity = 0

    @field_validator("min_runtime", "grace_period")
    @classmethod
    def _duration(cls, v: Quantity) -> Quantity:
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
        return PreemptionPolicy(
            reclaim=p.reclaim,
            fair_share=p.fair_share,
            within_queue=p.within_queue,
            min_runtime=parse_duration(p.min_runtime),
            grace_period=parse_duration(p.grace_period),
        )


def field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_message(err: ValidationError) -> str:
    e = err.errors()[0]
    msg = e["msg"].removeprefix("Value error, ")
    loc = tuple(p for p in e["loc"] if p not in ("str", "int", "float"))
    cause = e.get("ctx", {}).get("error")
    if isinstance(cause, RequestError) and cause.field:  # the fault is in one resource of the mapping
        loc, msg = (*loc, cause.field), cause.problem
    if e["type"] == "extra_forbidden":
        return f"{field_path(loc)}: unknown key"
    if e["type"] == "missing":
        return f"{field_path(loc)}: required key is missing"
    return f"{field_path(loc)}: {msg}" if loc else msg
