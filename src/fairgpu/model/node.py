"""Nodes and their GPU devices."""

from __future__ import annotations

from dataclasses import dataclass, field

from fairgpu.model.constraints import Taint
from fairgpu.model.mig import MIG_MODE as MIG_MODE
from fairgpu.model.mig import MigTemplate as MigTemplate
from fairgpu.model.mig import mig_candidates as mig_candidates

GPU_CORES = 100  # percent of one GPU's compute
DEFAULT_SPLIT_COUNT = 10  # HAMi deviceSplitCount: tasks one GPU may hold


@dataclass(slots=True, frozen=True)
class GpuDevice:
    model: str
    memory_mib: int
    uuid: str = ""
    healthy: bool = True
    split: int = 0  # tasks this card may hold (HAMi's per-card `count`); 0 = the node's split_count
    mode: str = "hami-core"  # HAMi's sharing mode of the card (nvidia.com/vgpu-mode must contain it)
    cores: int = GPU_CORES  # HAMi's devcore: 100 × deviceCoreScaling, the cores tasks may share on this card
    numa: int = 0  # NUMA node (nvidia.com/numa-bind keeps a container's cards on one)
    mig: tuple[MigTemplate, ...] = ()  # mode "mig": the MIG profiles HAMi may carve the card into


@dataclass(slots=True)
class NodeSpec:
    name: str
    cpu_m: int
    memory_mib: int
    gpus: tuple[GpuDevice, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    split_count: int = DEFAULT_SPLIT_COUNT
    schedulable: bool = True  # False: cordoned
    taints: tuple[Taint, ...] = ()
