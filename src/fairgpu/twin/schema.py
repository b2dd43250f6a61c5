"""The trace format, version 2: what a driver saw, one JSON object per line (docs/twin.md is its reference).

A trace opens with a `header` and holds, in time order: `nodes` and `queues` snapshots (whole, whenever they
change), and per workload its `submit` (pods with their requests, queue, user, priority), each `start`, an
`evict` decision, a `refused` eviction (version 2), and its `end` (finished, evicted or withdrawn). Version 1
traces (no `refused`) read as they are. Times `t` are seconds since the header's `epoch` (the driver's
clock). Both drivers share this module: the controller and `fairgpu record` write records (twin/encode.py
makes them from the engine's data), the simulator reads them back; neither imports the other.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from fairgpu.errors import ScenarioError
from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec
from fairgpu.model.constraints import MatchExpression, Taint, Toleration
from fairgpu.model.mig import MigTemplate
from fairgpu.spec import QueueDoc, Strict, validation_message

SCHEMA = "fairgpu-trace"
VERSION = 2
READS = (1, 2)  # versions this reader takes: each adds kinds or fields to the one before


class MigDoc(Strict):
    name: str
    memory_mib: int = Field(ge=0)
    cores: int = Field(ge=0)
    slices: int = Field(ge=0)
    placements: list[tuple[int, int]] = Field(default_factory=list)  # (start, size)


class GpuDoc(Strict):
    model: str
    memory_mib: int = Field(ge=0)
    uuid: str = ""
    healthy: bool = True
    split: int = Field(default=0, ge=0)
    mode: str = "hami-core"
    cores: int = Field(default=100, ge=0)  # HAMi's devcore
    numa: int = Field(default=0, ge=0)
    mig: list[MigDoc] = Field(default_factory=list)  # mode mig: the profiles the card registered

    def device(self) -> GpuDevice:
        mig = tuple(MigTemplate(m.name, m.memory_mib, m.cores, m.slices, tuple(m.placements)) for m in self.mig)
        return GpuDevice(self.model, self.memory_mib, self.uuid, self.healthy, self.split, self.mode, self.cores,
                         self.numa, mig)  # fmt: skip


class TaintRec(Strict):
    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class NodeDoc(Strict):
    name: str = Field(min_length=1)
    cpu_m: int = Field(ge=0)
    memory_mib: int = Field(ge=0)
    gpus: list[GpuDoc] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    split_count: int = Field(default=10, ge=1)
    schedulable: bool = True
    taints: list[TaintRec] = Field(default_factory=list)
    pair_scores: list[list[int]] = Field(default_factory=list)  # HAMi's GPU pair scores, GPU × GPU

    def spec(self) -> NodeSpec:
        gpus = tuple(g.device() for g in self.gpus)
        taints = tuple(Taint(t.key, t.value, t.effect) for t in self.taints)
        return NodeSpec(
            self.name, self.cpu_m, self.memory_mib, gpus, dict(self.labels), self.split_count, self.schedulable, taints,
            tuple(tuple(row) for row in self.pair_scores),
        )  # fmt: skip


class GpuRequestDoc(Strict):
    count: int = Field(ge=1)
    cores: int = Field(ge=0, le=100)
    mem_mib: int = Field(default=0, ge=0)
    mem_pct: int = Field(default=100, ge=0, le=100)


class ExpressionRec(Strict):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = Field(default_factory=list)

    def expression(self) -> MatchExpression:
        return MatchExpression(self.key, self.operator, tuple(self.values))


class TolerationRec(Strict):
    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""


class PodDoc(Strict):
    cpu_m: int = Field(default=0, ge=0)
    memory_mib: int = Field(default=0, ge=0)
    gpu: GpuRequestDoc | None = None
    more_gpus: list[GpuRequestDoc] = Field(default_factory=list)  # the further GPU containers'
    gpu_include: list[str] = Field(default_factory=list)
    gpu_exclude: list[str] = Field(default_factory=list)
    gpu_uuid_include: list[str] = Field(default_factory=list)
    gpu_uuid_exclude: list[str] = Field(default_factory=list)
    node_selector: dict[str, str] = Field(default_factory=dict)
    affinity: list[list[ExpressionRec]] = Field(default_factory=list)
    tolerations: list[TolerationRec] = Field(default_factory=list)
    node_policy: str = ""
    gpu_policy: str = ""  # HAMi's chain as written
    gpu_mutex: bool = False  # traces before the chain was kept whole: `mutex` beside gpu_policy
    gpu_weights: tuple[int, int, int] = (1, 1, 1)
    gpu_mode: str | None = None
    numa_bind: bool = False

    def spec(self) -> PodSpec:
        g = self.gpu
        return PodSpec(
            cpu_m=self.cpu_m,
            memory_mib=self.memory_mib,
            gpu=None if g is None else GpuRequest(g.count, g.cores, g.mem_mib, g.mem_pct),
            more_gpus=tuple(GpuRequest(m.count, m.cores, m.mem_mib, m.mem_pct) for m in self.more_gpus),
            gpu_include=tuple(self.gpu_include),
            gpu_exclude=tuple(self.gpu_exclude),
            gpu_uuid_include=tuple(self.gpu_uuid_include),
            gpu_uuid_exclude=tuple(self.gpu_uuid_exclude),
            node_selector=tuple(sorted(self.node_selector.items())),
            affinity=tuple(tuple(e.expression() for e in term) for term in self.affinity),
            tolerations=tuple(Toleration(t.key, t.operator, t.value, t.effect) for t in self.tolerations),
            node_policy=self.node_policy,
            gpu_policy=",".join(filter(None, (self.gpu_policy, "mutex" if self.gpu_mutex else ""))),
            gpu_weights=self.gpu_weights,
            gpu_mode=self.gpu_mode,
            numa_bind=self.numa_bind,
        )


class Header(Strict):
    kind: Literal["header"]
    schema_: Literal["fairgpu-trace"] = Field(alias="schema")
    version: int
    epoch: float  # the driver's clock at t = 0 (seconds; Unix time for the controller)
    source: Literal["run", "record", "simulate"]
    scheduler: str = "fairgpu"
    profile: str = ""  # the profile that decided (empty when recorded passively)


class Nodes(Strict):
    kind: Literal["nodes"]
    t: float
    nodes: list[NodeDoc]


class Queues(Strict):
    kind: Literal["queues"]
    t: float
    queues: list[QueueDoc]


class Submit(Strict):
    kind: Literal["submit"]
    t: float
    workload: str = Field(min_length=1)
    queue: str = Field(min_length=1)
    submitted: float  # the workload's own submit time (its pods' creation), seconds since the epoch
    pods: list[PodDoc] = Field(min_length=1)
    pod_names: list[str] = Field(default_factory=list)
    user: str = ""
    priority: int = 0
    duration: float | None = Field(default=None, ge=0)  # the run time the engine was told (expected-runtime)
    min_pods: int | None = Field(default=None, ge=1)
    preemptible: bool = True


class Start(Strict):
    kind: Literal["start"]
    t: float
    workload: str = Field(min_length=1)
    nodes: list[str] = Field(default_factory=list)  # where each placed pod runs
    began: float | None = None  # found running (adopted, or in a rotated file's snapshot): when it started


class Evict(Strict):
    kind: Literal["evict"]
    t: float
    workload: str = Field(min_length=1)
    reason: str = ""
    grace: float = Field(default=0.0, ge=0)
    pods: list[int] | None = None  # an elastic workload gives back only these pods


class Refused(Strict):
    """The eviction last decided for a workload was refused (a PodDisruptionBudget): it runs on."""

    kind: Literal["refused"]
    t: float
    workload: str = Field(min_length=1)
    retry: float  # when the engine may choose it as a victim again (trace seconds)


class End(Strict):
    kind: Literal["end"]
    t: float
    workload: str = Field(min_length=1)
    outcome: Literal["finished", "evicted", "withdrawn"]
    ran: float | None = Field(default=None, ge=0)  # how long its pods ran, when the driver saw them run (seconds)


Record = Header | Nodes | Queues | Submit | Start | Evict | Refused | End
_BY_KIND: dict[str, type[Record]] = {
    "header": Header,
    "nodes": Nodes,
    "queues": Queues,
    "submit": Submit,
    "start": Start,
    "evict": Evict,
    "refused": Refused,
    "end": End,
}
KINDS = tuple(_BY_KIND)


# -- records → checked objects ----------------------------------------------------------------------------
def read(path: Path) -> Iterator[tuple[int, Record]]:
    """(line number, record) of a trace file, checked: the first line a header of a version it reads, then
    records in time order. Any problem is a ScenarioError of one line naming the file, the line and the field."""
    if not path.is_file():
        raise ScenarioError(f"{path}: no such file")
    last_t = -math.inf
    line = 0
    try:
        with path.open(encoding="utf-8") as fh:
            for line, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                rec = parse(text, f"{path}:{line}")
                if line == 1 and not isinstance(rec, Header):
                    raise ScenarioError(f"{path}:1: kind: a trace starts with a header, not {rec.kind!r}")
                if line > 1 and isinstance(rec, Header):
                    raise ScenarioError(f"{path}:{line}: kind: a second header (concatenated traces?)")
                if not isinstance(rec, Header):
                    if rec.t < last_t:
                        raise ScenarioError(f"{path}:{line}: t: {rec.t:g} is before the line above's {last_t:g}")
                    last_t = rec.t
                yield line, rec
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}:{line + 1}: not a text trace (bytes that are not UTF-8)") from None
    if line == 0:
        raise ScenarioError(f"{path}: empty; a trace starts with a header line")


def parse(text: str, where: str) -> Record:
    """One line: a ScenarioError `where: field: problem` if it is not a valid record."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ScenarioError(f"{where}: not JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(doc, dict):
        raise ScenarioError(f"{where}: a record is a JSON object, not {type(doc).__name__}")
    kind = doc.get("kind")
    if kind not in KINDS:
        raise ScenarioError(f"{where}: kind: {kind!r} is not one of {', '.join(KINDS)}")
    if kind == "header" and doc.get("version") not in READS:
        known = " and ".join(map(str, READS))
        raise ScenarioError(f"{where}: version: {doc.get('version')!r}; this fairgpu reads versions {known}")
    try:
        return _BY_KIND[kind].model_validate(doc)
    except ValidationError as err:
        raise ScenarioError(f"{where}: {validation_message(err)}") from None
