"""Scenario files: a cluster, its queues and the workloads submitted to it, validated at the edge.

Every error names the field (`workloads[2].requests.cpu`) and the problem, so the CLI can print one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from importlib import resources as pkg_resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from fairgpu import hamiconfig
from fairgpu import resources as r
from fairgpu.errors import QuantityError, RequestError, ScenarioError
from fairgpu.model import NodeSpec, PodSpec, QueueSpec, QueueTree, Workload, gpu_request
from fairgpu.model.constraints import (
    MatchExpression,
    Operator,
    Policy,
    TaintEffect,
    Toleration,
    gpu_policy_names,
    scoring_weights,
)
from fairgpu.model.pod import DEFAULT_RULES, GpuRules, parse_request
from fairgpu.sim.nodes import MAX_NODES, ClusterDoc, build_nodes
from fairgpu.spec import (
    Quantity,
    QueueDoc,
    Strict,
    load_yaml,
    parse_duration,
    require_memory_unit,
    validation_message,
)
from fairgpu.state import ClusterState

# Past these a scenario is a typo, not a cluster: refuse it with a line instead of running out of memory
# (MAX_NODES: sim/nodes.py).
MAX_WORKLOADS = 1_000_000
MAX_PODS_PER_WORKLOAD = 10_000
# Kubernetes PriorityClass values are 32-bit; user classes stop at one billion
PRIORITY_RANGE = (-(2**31), 1_000_000_000)


class ExpressionDoc(Strict):
    key: str = Field(min_length=1)
    operator: Operator
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _valid(self) -> ExpressionDoc:
        self.expression()
        return self

    def expression(self) -> MatchExpression:
        return MatchExpression(self.key, self.operator, tuple(self.values))


class TolerationDoc(Strict):
    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Literal[""] | TaintEffect = ""

    @model_validator(mode="after")
    def _valid(self) -> TolerationDoc:
        self.toleration()
        return self

    def toleration(self) -> Toleration:
        return Toleration(self.key, self.operator, self.value, self.effect)


class WorkloadGroup(Strict):
    queue: str
    name: str = ""  # prefix of workload names; defaults to "<queue>-<index>"
    at: Quantity = 0
    count: int = Field(default=1, ge=0, le=MAX_WORKLOADS)
    every: Quantity = 0
    pods: int = Field(default=1, ge=1, le=MAX_PODS_PER_WORKLOAD)
    priority: int = Field(default=0, ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1])
    duration: Quantity
    duration_max: Quantity | None = None  # durations drawn uniformly in [duration, duration_max]
    user: str = ""
    requests: dict[str, Quantity] = Field(default_factory=dict)
    gpu_include: list[str] = Field(default_factory=list)
    gpu_exclude: list[str] = Field(default_factory=list)
    min_pods: int | None = Field(default=None, ge=1)  # elastic: runs with this many, grows to `pods`
    preemptible: bool = True
    gpu_uuid_include: list[str] = Field(default_factory=list)
    gpu_uuid_exclude: list[str] = Field(default_factory=list)
    node_selector: dict[str, str] = Field(default_factory=dict)
    node_affinity: list[list[ExpressionDoc]] = Field(default_factory=list)  # any term; all its expressions
    tolerations: list[TolerationDoc] = Field(default_factory=list)
    node_scheduler_policy: Policy | None = None
    gpu_scheduler_policy: str | None = None  # HAMi's chain: binpack, spread, mutex, topology-aware, numa
    device_scoring_weights: str | None = None  # HAMi's hami.io/device-scoring-weights: slot=1,core=1,memory=3
    numa_bind: bool = False  # HAMi's nvidia.com/numa-bind
    vgpu_mode: str | None = None  # nvidia.com/vgpu-mode: hami-core, mps (a card's mode must be a substring)

    @field_validator("gpu_scheduler_policy")
    @classmethod
    def _gpu_policy(cls, v: str | None) -> str | None:
        if v is not None:
            gpu_policy_names(v)
        return v

    @field_validator("device_scoring_weights")
    @classmethod
    def _weights(cls, v: str | None) -> str | None:
        if v is not None:
            scoring_weights(v)
        return v

    @field_validator("at", "every", "duration", "duration_max")
    @classmethod
    def _duration(cls, v: Quantity | None) -> Quantity | None:
        if v is not None:
            parse_duration(v)
        return v

    @field_validator("requests")
    @classmethod
    def _requests(cls, v: dict[str, Quantity]) -> dict[str, Quantity]:
        unknown = sorted(set(v) - set(r.POD_RESOURCES))
        if unknown:
            raise ValueError(f"unknown resource {unknown[0]!r} (expected one of {', '.join(r.POD_RESOURCES)})")
        if r.MEMORY in v:
            try:
                require_memory_unit(v[r.MEMORY])
            except QuantityError as err:
                raise RequestError(str(err), r.MEMORY) from None
        pod_from_requests(v)
        return v

    @model_validator(mode="after")
    def _spread(self) -> WorkloadGroup:
        if self.min_pods is not None and self.min_pods > self.pods:
            raise ValueError(f"min_pods ({self.min_pods}) must not exceed pods ({self.pods})")
        if self.duration_max is not None and parse_duration(self.duration_max) < parse_duration(self.duration):
            raise ValueError("duration_max must not be less than duration")
        return self

    @field_validator("node_affinity")
    @classmethod
    def _terms(cls, v: list[list[ExpressionDoc]]) -> list[list[ExpressionDoc]]:
        if any(not term for term in v):
            raise ValueError("a node affinity term needs at least one expression")
        return v

    def pod_spec(self, rules: GpuRules = DEFAULT_RULES) -> PodSpec:
        return replace(
            pod_from_requests(self.requests, tuple(self.gpu_include), tuple(self.gpu_exclude), rules),
            gpu_uuid_include=tuple(self.gpu_uuid_include),
            gpu_uuid_exclude=tuple(self.gpu_uuid_exclude),
            node_selector=tuple(sorted(self.node_selector.items())),
            affinity=tuple(tuple(e.expression() for e in term) for term in self.node_affinity),
            tolerations=tuple(t.toleration() for t in self.tolerations),
            node_policy=self.node_scheduler_policy or "",
            gpu_policy=self.gpu_scheduler_policy or "",
            gpu_weights=scoring_weights(self.device_scoring_weights) if self.device_scoring_weights else (1, 1, 1),
            numa_bind=self.numa_bind,
            gpu_mode=self.vgpu_mode,
        )


def pod_from_requests(
    req: dict[str, Quantity],
    include: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
    rules: GpuRules = DEFAULT_RULES,
) -> PodSpec:
    """A PodSpec from Kubernetes-style resource requests, HAMi's rules applied. Raises RequestError."""
    return PodSpec(
        cpu_m=parse_request(r.CPU, req.get(r.CPU, 0), r.cpu_millicores),
        memory_mib=parse_request(r.MEMORY, req.get(r.MEMORY, 0), r.memory_mib),
        gpu=gpu_request(req, rules),
        gpu_include=include,
        gpu_exclude=exclude,
    )


class ScenarioDoc(Strict):
    name: str = Field(min_length=1)
    description: str = ""
    horizon: Quantity
    seed: int = 0
    cluster: ClusterDoc
    queues: list[QueueDoc] = Field(min_length=1)
    workloads: list[WorkloadGroup] = Field(default_factory=list)
    hami: dict[str, Any] | None = None  # HAMi's device config, `nvidia` section keys (docs/hami.md)

    @field_validator("hami")
    @classmethod
    def _hami(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        hamiconfig.from_mapping(v, "hami")
        return v

    @field_validator("horizon")
    @classmethod
    def _horizon(cls, v: Quantity) -> Quantity:
        if parse_duration(v) <= 0:
            raise ValueError("horizon must be positive")
        return v


@dataclass(slots=True, frozen=True)
class Change:
    """At `t`, the inventory or the queues became these (a recorded trace's later snapshots); None: unchanged."""

    t: float
    nodes: list[NodeSpec] | None = None
    queues: list[QueueSpec] | None = None


@dataclass(slots=True)
class Scenario:
    """A validated scenario, in the engine's model."""

    name: str
    horizon: float
    nodes: list[NodeSpec]
    queues: list[QueueSpec]
    workloads: list[Workload]
    description: str = ""
    changes: list[Change] = field(default_factory=list)  # in time order
    # Evicted work comes back as on a cluster, whose controllers recreate evicted pods (how a recorded trace
    # replays): a whole workload waits again from its eviction, as new pods wait from their creation, rather
    # than keeping its place; an elastic workload's evicted pods are gone for good (replacements, if any,
    # arrive as new work) rather than growing back.
    recreated: bool = False
    # Evictions a cluster refused (a PodDisruptionBudget): per workload, for each whole-workload eviction
    # decided for it in turn, the back-off in seconds if it was refused, None if carried out.
    refusals: dict[str, list[float | None]] = field(default_factory=dict)

    def tree(self) -> QueueTree:
        return QueueTree(self.queues)

    def report_tree(self) -> QueueTree:
        """Every queue the run ever has, for its figures: the first queues, then those created later."""
        if not self.changes:
            return self.tree()
        specs = {q.name: q for q in self.queues}
        for ch in self.changes:
            for q in ch.queues or ():
                specs.setdefault(q.name, q)
        return QueueTree(list(specs.values()))


def build(doc: dict[str, Any]) -> Scenario:
    """Validate a scenario mapping and turn it into engine objects. Raises ScenarioError."""
    if not isinstance(doc, dict):
        raise ScenarioError("scenario: expected a mapping at the top level")
    try:
        sd = ScenarioDoc.model_validate(doc)
    except ValidationError as err:
        raise ScenarioError(validation_message(err)) from err

    total_nodes = sum(g.count for g in sd.cluster.nodes)
    if total_nodes > MAX_NODES:
        raise ScenarioError(f"cluster.nodes: {total_nodes:,} nodes in all; at most {MAX_NODES:,} are supported")
    total_workloads = sum(g.count for g in sd.workloads)
    if total_workloads > MAX_WORKLOADS:
        raise ScenarioError(f"workloads: {total_workloads:,} in all; at most {MAX_WORKLOADS:,} are supported")
    hami = hamiconfig.from_mapping(sd.hami, "hami")
    nodes = build_nodes(sd.cluster, hami)
    if len({n.name for n in nodes}) != len(nodes):
        raise ScenarioError("cluster.nodes: node names collide; give each group a distinct name")

    names = [q.name for q in sd.queues]
    queues = []
    for qi, q in enumerate(sd.queues):
        if names.count(q.name) > 1:
            raise ScenarioError(f"queues[{qi}].name: {q.name!r} is used twice")
        if q.parent is not None and q.parent not in names:
            raise ScenarioError(f"queues[{qi}].parent: {q.parent!r} is not a queue")
        queues.append(q.to_spec())
    _check_guarantees(sd.queues, queues, nodes)
    try:
        tree = QueueTree(queues)
    except ValueError as err:
        raise ScenarioError(f"queues: {err}") from err

    empty = ClusterState(nodes)
    rng = np.random.default_rng(sd.seed)
    workloads: list[Workload] = []
    for wi, wg in enumerate(sd.workloads):
        where = f"workloads[{wi}]"
        leaf = tree.index.get(wg.queue)
        if leaf is None:
            raise ScenarioError(f"{where}.queue: {wg.queue!r} is not a queue (known: {', '.join(names)})")
        if not tree.is_leaf[leaf]:
            raise ScenarioError(f"{where}.queue: {wg.queue!r} has child queues; workloads go to leaf queues")
        pod = wg.pod_spec(hami.rules())
        problem = empty.unplaceable_reason(pod)
        if problem:
            raise ScenarioError(f"{where}.requests: {problem}")
        at, every = parse_duration(wg.at), parse_duration(wg.every)
        lo = parse_duration(wg.duration)
        hi = parse_duration(wg.duration_max) if wg.duration_max is not None else lo
        prefix = wg.name or f"{wg.queue}-{wi}"
        for k in range(wg.count):
            workloads.append(
                Workload(
                    name=f"{prefix}-{k}",
                    queue=wg.queue,
                    pods=(pod,) * wg.pods,
                    submit_time=at + k * every,
                    priority=wg.priority,
                    duration=float(rng.uniform(lo, hi)) if hi > lo else lo,
                    user=wg.user,
                    min_pods=wg.min_pods,
                    preemptible=wg.preemptible,
                )
            )
    if len({w.name for w in workloads}) != len(workloads):
        raise ScenarioError("workloads: workload names collide; give each group a distinct name")
    return Scenario(sd.name, parse_duration(sd.horizon), nodes, queues, workloads, sd.description)


def _check_guarantees(docs: list[QueueDoc], queues: list[QueueSpec], nodes: list[NodeSpec]) -> None:
    """A guarantee larger than the whole cluster can never be honoured: say so rather than run."""
    capacity = ClusterState(nodes).capacity_vector() if nodes else r.zeros()
    for qi, (doc, spec) in enumerate(zip(docs, queues, strict=True)):
        for key in doc.guaranteed:
            dim, unit, scale = _GUARANTEE_DIMS[key]
            if spec.guaranteed[dim] > capacity[dim] + 1e-9:
                raise ScenarioError(
                    f"queues[{qi}].guaranteed.{key}: {doc.guaranteed[key]} is more than the whole cluster has "
                    f"({capacity[dim] * scale:g} {unit})"
                )


# quota resource → (fair dimension, unit of the message, factor from the dimension's unit)
_GUARANTEE_DIMS = {
    r.GPU: (r.DIM_GPU, "GPUs", 1.0),
    r.GPUCORES: (r.DIM_GPU, "GPUs", 1.0),
    r.GPUMEM: (r.DIM_GPUMEM, "MiB of GPU memory", 1.0),
    r.CPU: (r.DIM_CPU, "CPUs", 1e-3),
    r.MEMORY: (r.DIM_MEMORY, "MiB of memory", 1.0),
}


def builtin_scenarios() -> dict[str, str]:
    """Built-in scenario name → description."""
    folder = pkg_resources.files("fairgpu") / "sim" / "scenarios"
    out = {}
    for p in sorted(folder.iterdir(), key=lambda p: p.name):
        if p.name.endswith(".yaml"):
            doc = yaml.safe_load(p.read_text())
            out[p.name.removesuffix(".yaml")] = " ".join(str(doc.get("description", "")).split())
    return out


def load(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a scenario YAML file by path. Raises ScenarioError."""
    if name_or_path in builtin_scenarios():
        text = (pkg_resources.files("fairgpu") / "sim" / "scenarios" / f"{name_or_path}.yaml").read_text()
    else:
        path = Path(name_or_path)
        if not path.is_file():
            known = ", ".join(builtin_scenarios())
            raise ScenarioError(f"scenario {name_or_path!r}: no such file or built-in scenario ({known})")
        text = read_text(path)
    return build(load_yaml(text, f"scenario {name_or_path}"))


def read_text(path: Path) -> str:
    """A user's text file; a binary or unreadable one is a ScenarioError naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not a text file (not UTF-8)") from None
    except OSError as err:
        raise ScenarioError(f"{path}: {err.strerror}") from None
