"""Pods, their GPU requests with HAMi's defaults, and workloads (a gang when it has several pods)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from fairgpu import resources as r
from fairgpu.errors import RequestError
from fairgpu.model.constraints import POLICIES, MatchExpression, Toleration
from fairgpu.model.node import GPU_CORES

T = TypeVar("T")


def parse_request(name: str, raw: object, parse: Callable[[object], T]) -> T:
    """One resource value, with a RequestError naming the resource if it is not a valid quantity."""
    try:
        return parse(raw)
    except r.QuantityError as err:
        raise RequestError(str(err), name) from err


@dataclass(slots=True, frozen=True)
class GpuRequest:
    """Per-container GPU request after HAMi's defaults: `count` distinct GPUs, each with these amounts."""

    count: int
    cores: int  # percent of each GPU; 100 means an exclusive card
    mem_mib: int  # MiB of each GPU; 0 means "mem_pct of the GPU's memory"
    mem_pct: int = 100

    @property
    def exclusive(self) -> bool:
        return self.cores >= GPU_CORES

    def mem_for(self, gpu_memory_mib: int | np.ndarray) -> int | np.ndarray:
        """MiB this request takes on a GPU with that much memory."""
        if self.mem_mib:
            return self.mem_mib
        return gpu_memory_mib * self.mem_pct // 100

    def gpu_equivalents(self) -> float:
        return self.count * self.cores / GPU_CORES


def gpu_request(requests: Mapping[str, object]) -> GpuRequest | None:
    """Apply HAMi's defaults (design/hami-interop.md §1.2) to a container's GPU resources.

    gpu alone → whole exclusive cards; gpumem/gpucores alone imply gpu 1; gpumem 0 or a percentage ≤ 0
    means 100 % of memory.
    """
    given = {k: requests[k] for k in (r.GPU, r.GPUCORES, r.GPUMEM, r.GPUMEM_PCT) if k in requests}
    if not given:
        return None
    count = parse_request(r.GPU, given.get(r.GPU, 1), r.count)
    cores_given = r.GPUCORES in given
    cores = parse_request(r.GPUCORES, given.get(r.GPUCORES, 0), r.count)
    mem = parse_request(r.GPUMEM, given.get(r.GPUMEM, 0), r.gpumem_mib)
    pct = float(parse_request(r.GPUMEM_PCT, given.get(r.GPUMEM_PCT, 0), r.parse_quantity))
    if count == 0:
        if cores or mem or pct > 0:
            raise RequestError("0 GPUs cannot carry gpucores/gpumem requests", r.GPU)
        return None
    if cores > GPU_CORES:
        raise RequestError(f"{cores} is more than 100 % of a GPU", r.GPUCORES)
    if pct > 100:
        raise RequestError(f"{pct:g} is more than 100 % of a GPU's memory", r.GPUMEM_PCT)
    mem_pct = 100 if (mem or pct <= 0) else int(pct)
    if not cores_given and mem == 0 and mem_pct == 100:
        cores = GPU_CORES  # HAMi's webhook makes a gpu-only (or 100 %-memory) request an exclusive card
    return GpuRequest(count=count, cores=cores, mem_mib=mem, mem_pct=mem_pct)


@dataclass(slots=True, frozen=True)
class PodSpec:
    """What one pod asks for and where it may run."""

    cpu_m: int = 0
    memory_mib: int = 0
    gpu: GpuRequest | None = None
    gpu_include: tuple[str, ...] = ()  # GPU model substrings allowed (case-insensitive)
    gpu_exclude: tuple[str, ...] = ()
    gpu_uuid_include: tuple[str, ...] = ()  # nvidia.com/use-gpuuuid: only these GPUs
    gpu_uuid_exclude: tuple[str, ...] = ()  # nvidia.com/nouse-gpuuuid
    node_selector: tuple[tuple[str, str], ...] = ()  # every label must match
    affinity: tuple[tuple[MatchExpression, ...], ...] = ()  # required terms: any term, all its expressions
    tolerations: tuple[Toleration, ...] = ()
    node_policy: str = ""  # hami.io/node-scheduler-policy: binpack | spread ("" = the profile's scores)
    gpu_policy: str = ""  # hami.io/gpu-scheduler-policy

    def __post_init__(self) -> None:
        for name in ("node_policy", "gpu_policy"):
            value = getattr(self, name)
            if value and value not in POLICIES:
                raise RequestError(f"{value!r} is not one of {', '.join(POLICIES)}", name)

    def allows_model(self, model: str) -> bool:
        """HAMi's use-gputype / nouse-gputype: case-insensitive substrings of the model name."""
        low = model.lower()
        if self.gpu_include and not any(s.lower() in low for s in self.gpu_include):
            return False
        return not any(s.lower() in low for s in self.gpu_exclude)

    def key(self) -> tuple:
        """Identical keys fit the same places: the scheduler caches failures by it within a cycle."""
        return (
            self.cpu_m,
            self.memory_mib,
            self.gpu,
            self.gpu_include,
            self.gpu_exclude,
            self.gpu_uuid_include,
            self.gpu_uuid_exclude,
            self.node_selector,
            self.affinity,
            self.tolerations,
        )

    def charge(self, mean_gpu_memory_mib: float) -> np.ndarray:
        """The fair vector this pod counts against its queue (gpu in GPU-equivalents)."""
        vec = r.zeros()
        vec[r.DIM_CPU] = self.cpu_m
        vec[r.DIM_MEMORY] = self.memory_mib
        if self.gpu is not None:
            g = self.gpu
            vec[r.DIM_GPU] = g.gpu_equivalents()
            per_gpu = g.mem_mib if g.mem_mib else mean_gpu_memory_mib * g.mem_pct / 100
            vec[r.DIM_GPUMEM] = g.count * per_gpu
        return vec


@dataclass(slots=True)
class Workload:
    """One job: its pods are placed all-or-nothing when the profile has a gang permit."""

    name: str
    queue: str
    pods: tuple[PodSpec, ...]
    submit_time: float = 0.0
    priority: int = 0
    duration: float | None = None  # run time once all pods run; None = runs until removed
    user: str = ""
    pod_names: tuple[str, ...] = field(default=())
    min_pods: int | None = None  # elastic: runs once this many pods run, grows towards len(pods)
    preemptible: bool = True  # False: never a victim while its queue is within its guarantee

    def __post_init__(self) -> None:
        if not self.pods:
            raise RequestError(f"workload {self.name}: needs at least one pod")
        if self.min_pods is not None and not 1 <= self.min_pods <= len(self.pods):
            raise RequestError(f"workload {self.name}: min_pods must be between 1 and its {len(self.pods)} pods")
        if not self.pod_names:
            self.pod_names = tuple(f"{self.name}-{i}" for i in range(len(self.pods)))

    @property
    def gang(self) -> bool:
        return len(self.pods) > 1

    @property
    def needed(self) -> int:
        """Pods that must run together before the workload runs (all of them, unless elastic)."""
        return len(self.pods) if self.min_pods is None else self.min_pods
