"""Pods, their GPU requests with HAMi's defaults, and workloads (a gang when it has several pods)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

from fairgpu import resources as r
from fairgpu.errors import QuantityError, RequestError
from fairgpu.model.constraints import DEFAULT_WEIGHTS, POLICIES, MatchExpression, Toleration, gpu_policy_names
from fairgpu.model.node import GPU_CORES

T = TypeVar("T")


def parse_request(name: str, raw: object, parse: Callable[[Any], T]) -> T:
    """One resource value, with a RequestError naming the resource if it is not a valid quantity."""
    try:
        return parse(raw)
    except QuantityError as err:
        raise RequestError(str(err), name) from err


@dataclass(slots=True, frozen=True)
class GpuRequest:
    """Per-container GPU request after HAMi's defaults: `count` distinct GPUs, each with these amounts."""

    count: int
    cores: int  # percent of each GPU (of 100 cores); 100 asks for a card to itself, given only on a card of 100
    mem_mib: int  # MiB of each GPU; 0 means "mem_pct of the GPU's memory"
    mem_pct: int = 100

    @property
    def exclusive(self) -> bool:
        """Asks for a whole card: granted card by card (node.exclusive_on, ClusterState.takes_whole_cards)."""
        return self.cores >= GPU_CORES

    def mem_for(self, gpu_memory_mib: int | np.ndarray) -> int | np.ndarray:
        """MiB this request takes on a GPU with that much memory."""
        if self.mem_mib:
            return self.mem_mib
        return gpu_memory_mib * self.mem_pct // 100

    def gpu_equivalents(self) -> float:
        return self.count * self.cores / GPU_CORES


@dataclass(slots=True, frozen=True)
class GpuRules:
    """What HAMi's config (its device ConfigMap's `nvidia` section) says about reading a container's GPU
    request: the resource names and the defaults. hamiconfig.HamiConfig builds one from a HAMi file."""

    count_name: str = r.GPU
    memory_name: str = r.GPUMEM
    percentage_name: str = r.GPUMEM_PCT
    cores_name: str = r.GPUCORES
    default_memory: int = 0  # MiB; 0 = all of each card
    default_cores: int = 0
    default_gpu_num: int = 1
    memory_factor: int = 1

    @property
    def names(self) -> tuple[str, str, str, str]:
        return (self.count_name, self.memory_name, self.percentage_name, self.cores_name)


DEFAULT_RULES = GpuRules()
_INT32_MAX = 2**31 - 1
_INT64 = 2**63


def _as_int64(name: str, raw: object) -> int | None:
    """Quantity.AsInt64: the value when it is a whole number within int64, else None."""
    q = parse_request(name, raw, r.parse_quantity)
    if q != q.to_integral_value() or not -_INT64 <= q < _INT64:
        return None
    return int(q)


def _value(name: str, raw: object) -> int:
    """Quantity.Value: rounded up to a whole number (what HAMi's webhook compares)."""
    return int(parse_request(name, raw, r.parse_quantity).to_integral_value(rounding="ROUND_CEILING"))


def webhook_defaults(requests: Mapping[str, object], rules: GpuRules = DEFAULT_RULES) -> dict[str, object]:
    """One container's resources after HAMi's webhook (`MutateAdmission`): gpumem, gpumem-percentage or
    gpucores without a GPU count add `defaultGPUNum` GPUs (`mutateContainerResource`); a GPU count without
    gpucores becomes an exclusive card (gpucores 100) when the percentage is 100, or, without a percentage,
    when no gpumem is given (`defaultExclusiveCoreIfNeeded`)."""
    out = dict(requests)
    count_name, mem_name, pct_name, cores_name = rules.names
    if count_name not in out and any(k in out for k in (mem_name, pct_name, cores_name)) and rules.default_gpu_num > 0:
        out[count_name] = str(rules.default_gpu_num)
    exclusive = (_value(pct_name, out[pct_name]) == 100) if pct_name in out else mem_name not in out
    if count_name in out and cores_name not in out and exclusive:
        out[cores_name] = str(GPU_CORES)
    return out


def scheduler_request(requests: Mapping[str, object], rules: GpuRules = DEFAULT_RULES) -> GpuRequest | None:
    """One container's request as HAMi's scheduler reads it (`GenerateResourceRequests`, then `Fit`'s clamp of
    cores to 100): gpumem a plain integer in MiB times memoryFactor within int32, percentage clamped to 100
    and ignored when ≤ 0, then defaultMemory (else 100 %) and defaultCores.

    None when the container asks for no GPU (no count, or 0). RequestError where HAMi silently drops the
    request (its device plugin would then fail the pod at Allocate): a count or gpumem that is not a whole
    number, or a gpumem out of range."""
    count_name, mem_name, pct_name, cores_name = rules.names
    if count_name not in requests:
        return None
    count = _as_int64(count_name, requests[count_name])
    if count is None or count < 0:
        raise RequestError(f"{requests[count_name]!r} is not a whole number of GPUs", count_name)
    if count == 0:
        return None
    mem = 0
    if mem_name in requests:
        factor = max(rules.memory_factor, 1)
        raw = _as_int64(mem_name, requests[mem_name])
        if raw is None or raw < 0 or raw > _INT32_MAX // factor:
            problem = "must be a plain integer number of MiB within int32 (HAMi drops the request otherwise)"
            raise RequestError(f"{requests[mem_name]!r} {problem}", mem_name)
        mem = raw * factor
    pct = 101  # HAMi's "unset"
    if pct_name in requests and (p := _as_int64(pct_name, requests[pct_name])) is not None:
        pct = min(p, 100) if p > 0 else 101
    if pct == 101 and mem == 0:
        if rules.default_memory:
            mem = rules.default_memory
        else:
            pct = 100
    cores = rules.default_cores
    if cores_name in requests and (c := _as_int64(cores_name, requests[cores_name])) is not None:
        if c < 0:
            raise RequestError(f"{requests[cores_name]!r} must not be negative", cores_name)
        cores = c
    return GpuRequest(count=count, cores=min(cores, GPU_CORES), mem_mib=mem, mem_pct=min(pct, 100))


def gpu_request(requests: Mapping[str, object], rules: GpuRules = DEFAULT_RULES) -> GpuRequest | None:
    """A container's GPU request exactly as HAMi reads it: its webhook's defaults, which fairgpu applies itself
    because HAMi's webhook skips pods that name another scheduler, then its scheduler's rules."""
    names = rules.names
    return scheduler_request(webhook_defaults({k: requests[k] for k in names if k in requests}, rules), rules)


@dataclass(slots=True, frozen=True)
class PodSpec:
    """What one pod asks for and where it may run."""

    cpu_m: int = 0
    memory_mib: int = 0
    gpu: GpuRequest | None = None  # the first GPU container's request
    more_gpus: tuple[GpuRequest, ...] = ()  # the further GPU containers', in container order (HAMi fits each in turn)
    gpu_include: tuple[str, ...] = ()  # GPU model substrings allowed (case-insensitive)
    gpu_exclude: tuple[str, ...] = ()
    gpu_uuid_include: tuple[str, ...] = ()  # nvidia.com/use-gpuuuid: only these GPUs
    gpu_uuid_exclude: tuple[str, ...] = ()  # nvidia.com/nouse-gpuuuid
    node_selector: tuple[tuple[str, str], ...] = ()  # every label must match
    affinity: tuple[tuple[MatchExpression, ...], ...] = ()  # required terms: any term, all its expressions
    tolerations: tuple[Toleration, ...] = ()
    node_policy: str = ""  # hami.io/node-scheduler-policy: binpack | spread ("" = the profile's scores)
    # hami.io/gpu-scheduler-policy as written (HAMi tells a chain from a single policy by its commas); set, the
    # cards are taken in HAMi's order (framework/cardfit.py), else in the profile's
    gpu_policy: str = ""
    gpu_weights: tuple[int, int, int] = DEFAULT_WEIGHTS  # hami.io/device-scoring-weights: slot, core, memory
    gpu_mode: str | None = None  # nvidia.com/vgpu-mode: a card's mode must be a substring of it
    numa_bind: bool = False  # nvidia.com/numa-bind: each container's cards on one NUMA node

    def __post_init__(self) -> None:
        if self.node_policy and self.node_policy not in POLICIES:
            raise RequestError(f"{self.node_policy!r} is not one of {', '.join(POLICIES)}", "node_policy")
        try:
            gpu_policy_names(self.gpu_policy)
        except ValueError as err:
            raise RequestError(str(err), "gpu_policy") from None
        if len(self.gpu_weights) != 3 or min(self.gpu_weights) < 0 or not any(self.gpu_weights):
            raise RequestError(f"{self.gpu_weights!r}: three non-negative weights, one positive", "gpu_weights")

    @property
    def gpu_mutex(self) -> bool:
        """The GPU policy names `mutex`: only cards with no task on them."""
        return "mutex" in gpu_policy_names(self.gpu_policy)

    @property
    def gpu_topology(self) -> bool:
        """The GPU policy names `topology-aware`: the best-connected cards (the worst-connected single card)."""
        return "topology-aware" in gpu_policy_names(self.gpu_policy)

    @property
    def gpus(self) -> tuple[GpuRequest, ...]:
        """Every GPU container's request, in container order."""
        return () if self.gpu is None else (self.gpu, *self.more_gpus)

    @property
    def whole_gpu(self) -> GpuRequest | None:
        """The whole GPU request as one container's, for scores and preemption that reason in (cards, cores
        per card): every container's cards (a card two containers could share counts twice), at their mean
        cores per card rounded up, exclusive only when every container is; memory the largest per card."""
        if not self.more_gpus:
            return self.gpu
        gs = self.gpus
        count = sum(g.count for g in gs)
        cores = -(-sum(g.count * g.cores for g in gs) // count)
        if any(not g.exclusive for g in gs):
            cores = min(cores, GPU_CORES - 1)
        return GpuRequest(count, cores, max(g.mem_mib for g in gs), max(g.mem_pct for g in gs))

    def as_one_container(self) -> PodSpec:
        """This pod with its whole GPU request in one container (itself when it has one GPU container)."""
        return self if not self.more_gpus else replace(self, gpu=self.whole_gpu, more_gpus=())

    @property
    def per_container(self) -> bool:
        """Cards chosen container by container in HAMi's order (several GPU containers, a GPU policy or scoring
        weights of the pod's own, a NUMA-bound multi-GPU container), not by the profile's: framework/cardfit.py."""
        if self.gpu is None:
            return False
        hami_order = bool(self.gpu_policy) or self.gpu_weights != DEFAULT_WEIGHTS
        return bool(self.more_gpus) or hami_order or (self.numa_bind and self.gpu.count > 1)

    def allows_model(self, model: str) -> bool:
        """HAMi's use-gputype / nouse-gputype: case-insensitive substrings of the model name."""
        low = model.lower()
        if self.gpu_include and not any(s.lower() in low for s in self.gpu_include):
            return False
        return not any(s.lower() in low for s in self.gpu_exclude)

    def allows_uuid(self, uuid: str) -> bool:
        """HAMi's use-gpuuuid / nouse-gpuuuid (`CheckUUID`): exact UUIDs."""
        return (not self.gpu_uuid_include or uuid in self.gpu_uuid_include) and uuid not in self.gpu_uuid_exclude

    def allows_mode(self, mode: str) -> bool:
        """HAMi's nvidia.com/vgpu-mode (`checkType`): the card's mode must be a substring of the annotation."""
        return self.gpu_mode is None or mode in self.gpu_mode

    def key(self) -> tuple[Any, ...]:
        """Identical keys fit the same places: the scheduler caches failures by it within a cycle."""
        return (
            self.cpu_m,
            self.memory_mib,
            self.gpu,
            self.more_gpus,
            self.numa_bind,
            self.gpu_include,
            self.gpu_exclude,
            self.gpu_uuid_include,
            self.gpu_uuid_exclude,
            self.gpu_policy,
            self.gpu_weights,
            self.gpu_mode,
            self.node_selector,
            self.affinity,
            self.tolerations,
        )

    def charge(self, mean_gpu_memory_mib: float) -> np.ndarray:
        """The fair vector this pod counts against its queue (gpu in GPU-equivalents)."""
        vec = r.zeros()
        vec[r.DIM_CPU] = self.cpu_m
        vec[r.DIM_MEMORY] = self.memory_mib
        for g in self.gpus:
            vec[r.DIM_GPU] += g.gpu_equivalents()
            per_gpu = g.mem_mib if g.mem_mib else mean_gpu_memory_mib * g.mem_pct / 100
            vec[r.DIM_GPUMEM] += g.count * per_gpu
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
