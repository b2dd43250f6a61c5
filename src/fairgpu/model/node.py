"""Nodes and their GPU devices."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fairgpu.errors import InputError
from fairgpu.model.constraints import Taint
from fairgpu.model.mig import MIG_MODE as MIG_MODE
from fairgpu.model.mig import MigTemplate as MigTemplate
from fairgpu.model.mig import mig_candidates as mig_candidates

GPU_CORES = 100  # percent of one GPU's compute
DEFAULT_SPLIT_COUNT = 10  # HAMi deviceSplitCount: tasks one GPU may hold


def exclusive_on(cores: Any, whole: Any) -> Any:
    """Whether a task asking `cores` of a card takes it to itself, on cards that are `whole` (devcore exactly
    100), scalars or arrays alike. HAMi's Fit (pkg/device/nvidia/device.go: `dev.Totalcore == 100 &&
    k.Coresreq == 100 && dev.Used > 0`) keeps a cores-100 task alone only on a 100-core card; on a card of
    another devcore (deviceCoreScaling ≠ 1) it is an ordinary share of the card's cores."""
    return (cores >= GPU_CORES) & whole


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
    # HAMi's GPU pair scores (hami.io/node-nvidia-score; NVLink and PCIe links): row j, column l is what card j
    # scores card l, in card order; () = none known (every pair 0). Read by the topology-aware GPU policy.
    pair_scores: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        g = len(self.gpus)
        if self.pair_scores and (len(self.pair_scores) != g or any(len(row) != g for row in self.pair_scores)):
            raise InputError(f"pair_scores: node {self.name} needs {g} rows of {g} scores, one per GPU")
