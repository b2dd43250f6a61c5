"""The cluster part of a scenario file (`cluster.nodes`): node groups, their GPUs as HAMi's device plugin
would register them (NUMA node, MIG mode and profiles, pair scores), validated at the edge; and the NodeSpecs
they make, the same the live driver reads from HAMi's annotations."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from fairgpu import resources as r
from fairgpu.hamiconfig import HamiConfig
from fairgpu.model import GpuDevice, NodeSpec
from fairgpu.model.constraints import Taint, TaintEffect
from fairgpu.model.mig import MIG_MODE, MigTemplate
from fairgpu.spec import Quantity, Strict, require_memory_unit

MAX_NODES = 100_000


class TaintDoc(Strict):
    key: str = Field(min_length=1)
    value: str = ""
    effect: TaintEffect = "NoSchedule"

    def taint(self) -> Taint:
        return Taint(self.key, self.value, self.effect)


class MigPlacementDoc(Strict):
    start: int = Field(ge=0, le=62)
    size: int = Field(ge=1, le=63)


class MigProfileDoc(Strict):
    """One MIG profile the cards offer, as HAMi's register annotation lists it (`migProfiles`)."""

    name: str = Field(min_length=1)  # e.g. 1g.10gb (HAMi takes 1g./3g. placements from the highest start)
    memory: Quantity  # the instance's memory (HAMi's memoryMB), with a unit: 10Gi
    cores: int = Field(ge=0, le=100)  # the instance's share of the card's cores (HAMi's core)
    slices: int = Field(ge=1)  # HAMi's sliceCount
    placements: list[MigPlacementDoc] = Field(min_length=1)

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: Quantity) -> Quantity:
        require_memory_unit(v)
        if r.memory_mib(v) <= 0:
            raise ValueError(f"{v!r} must be positive")
        return v

    def template(self) -> MigTemplate:
        places = tuple((p.start, p.size) for p in self.placements)
        return MigTemplate(self.name, r.memory_mib(self.memory), self.cores, self.slices, places)


class NodeGroup(Strict):
    count: int = Field(default=1, ge=0, le=MAX_NODES)
    name: str = ""  # prefix of node names; defaults to the group's index
    gpus: int = Field(default=0, ge=0)
    gpu_model: str = ""
    gpu_memory: Quantity = 0
    cpu: Quantity
    memory: Quantity
    labels: dict[str, str] = Field(default_factory=dict)
    split_count: int | None = Field(default=None, ge=1)  # default: hami.deviceSplitCount (10)
    taints: list[TaintDoc] = Field(default_factory=list)
    cordoned: bool = False
    unhealthy_gpus: int = Field(default=0, ge=0)  # the last this many GPUs of each node
    gpu_numa: list[int] = Field(default_factory=list)  # each GPU's NUMA node (HAMi's `numa`); default all 0
    gpu_mode: Literal["hami-core", "mig", "mps"] = "hami-core"  # HAMi's `mode` of every GPU of the group
    mig_profiles: list[MigProfileDoc] = Field(default_factory=list)  # mode mig: the profiles each card offers
    pair_scores: list[list[int]] = Field(default_factory=list)  # HAMi's hami.io/node-nvidia-score, GPU × GPU

    @field_validator("cpu", "memory", "gpu_memory")
    @classmethod
    def _quantity(cls, v: Quantity, info: ValidationInfo) -> Quantity:
        if info.field_name != "cpu":
            require_memory_unit(v)
        if r.parse_quantity(v) < 0:
            raise ValueError(f"{v!r} must not be negative")
        return v

    @field_validator("gpu_numa")
    @classmethod
    def _numa(cls, v: list[int]) -> list[int]:
        if any(n < 0 for n in v):
            raise ValueError("a NUMA node is not negative")
        return v

    @model_validator(mode="after")
    def _gpu_fields(self) -> NodeGroup:
        if self.gpus and (not self.gpu_model or r.memory_mib(self.gpu_memory) <= 0):
            raise ValueError("nodes with gpus need gpu_model and a positive gpu_memory")
        if self.unhealthy_gpus > self.gpus:
            raise ValueError("unhealthy_gpus: more than the node's gpus")
        if self.gpu_numa and len(self.gpu_numa) != self.gpus:
            raise ValueError(f"gpu_numa: {len(self.gpu_numa)} entries for {self.gpus} gpus (one per GPU)")
        if (self.gpu_mode == MIG_MODE) != bool(self.mig_profiles):
            raise ValueError("mig_profiles: needed with gpu_mode mig, and only then")
        for p in self.mig_profiles:
            if r.memory_mib(p.memory) > r.memory_mib(self.gpu_memory):
                raise ValueError(f"mig_profiles: {p.name} has more memory than the GPU ({self.gpu_memory})")
        if self.pair_scores and (
            len(self.pair_scores) != self.gpus or any(len(x) != self.gpus for x in self.pair_scores)
        ):
            raise ValueError(f"pair_scores: {self.gpus} rows of {self.gpus} scores, one per GPU")
        return self

    def gpu_devices(self, name: str, hami: HamiConfig) -> tuple[GpuDevice, ...]:
        """Each node's GPUs as HAMi's device plugin registers them: memory × deviceMemoryScaling (a MIG card
        its real memory), devcore, the NUMA node, the mode; a MIG card's task count is its most instances."""
        healthy = self.gpus - self.unhealthy_gpus
        cores = hami.registered_cores()  # devcore: what HAMi's Fit shares among a card's tasks
        mig = tuple(p.template() for p in self.mig_profiles)
        if mig:
            mem, split = r.memory_mib(self.gpu_memory), max(len(p.placements) for p in mig)
        else:
            mem, split = hami.registered_memory(r.memory_mib(self.gpu_memory)) if self.gpus else 0, 0
        numa = self.gpu_numa or [0] * self.gpus
        return tuple(
            GpuDevice(
                self.gpu_model,
                mem,
                f"GPU-{name}-{j}",
                j < healthy,
                self.split_count or split,
                self.gpu_mode,
                cores,
                numa[j],
                mig,
            )
            for j in range(self.gpus)
        )


class ClusterDoc(Strict):
    nodes: list[NodeGroup] = Field(min_length=1)


def build_nodes(cluster: ClusterDoc, hami: HamiConfig) -> list[NodeSpec]:
    """The NodeSpecs of every group (names `<name>-<k>`, GPUs `GPU-<node>-<j>`)."""
    nodes: list[NodeSpec] = []
    for gi, grp in enumerate(cluster.nodes):
        prefix = grp.name or f"node{gi}"
        pairs = tuple(tuple(row) for row in grp.pair_scores)
        for k in range(grp.count):
            name = f"{prefix}-{k}"
            nodes.append(
                NodeSpec(
                    name,
                    r.cpu_millicores(grp.cpu),
                    r.memory_mib(grp.memory),
                    grp.gpu_devices(name, hami),
                    dict(grp.labels),
                    split_count=grp.split_count or hami.device_split_count,
                    schedulable=not grp.cordoned,
                    taints=tuple(t.taint() for t in grp.taints),
                    pair_scores=pairs,
                )
            )
    return nodes
