"""ClusterState: free capacity of every node and GPU slot in numpy arrays, assign/release, invariants.

Nodes are rows; GPU slots are columns (padded to the largest node, `gpu_valid` marks real ones).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairgpu.errors import InputError, StateError
from fairgpu.model.node import GPU_CORES, NodeSpec
from fairgpu.model.pod import PodSpec


def scratch_key(*parts: object) -> str:
    """A ledger key for a dry-run placement on a copy of the state (reservations, replays, explanations).
    It starts with NUL, so it never collides with a pod's key (namespace/name) or another dry run's."""
    return "\0" + "-".join(str(p) for p in parts)


@dataclass(slots=True, frozen=True)
class Placement:
    """Where one pod runs: a node, and per card entry (its GPU slot, the cores and MiB it takes there).

    A pod with several GPU containers lists each container's entries in turn (`segments` says how many each
    has; empty means one container), so one card may appear once per container, as in HAMi."""

    node: int
    slots: tuple[int, ...] = ()
    cores: tuple[int, ...] = ()  # per entry, same order as slots
    mem_mib: tuple[int, ...] = ()  # per entry, same order as slots
    cpu_m: int = 0
    memory_mib: int = 0
    segments: tuple[int, ...] = ()  # entries per GPU container, in container order; () = one container

    def containers(self) -> list[range]:
        """The entry indices of each GPU container."""
        sizes = self.segments or ((len(self.slots),) if self.slots else ())
        starts = itertools.accumulate(sizes, initial=0)
        return [range(a, b) for a, b in itertools.pairwise(starts)]


@dataclass(slots=True, frozen=True)
class Footprint:
    """What a set of placements holds, as arrays: per pod (node, cpu, memory) and per GPU slot taken
    (node, slot, cores, MiB). `pod_tag`/`slot_tag` say which group (e.g. victim) each row belongs to."""

    pod_node: np.ndarray
    pod_cpu: np.ndarray
    pod_mem: np.ndarray
    pod_tag: np.ndarray
    slot_node: np.ndarray
    slot_idx: np.ndarray
    slot_cores: np.ndarray
    slot_mem: np.ndarray
    slot_tag: np.ndarray

    @classmethod
    def from_rows(cls, pods: Sequence[tuple[int, ...]], slots: Sequence[tuple[int, ...]]) -> Footprint:
        """From rows (node, cpu, memory, tag) per pod and (node, slot, cores, MiB, tag) per GPU slot."""
        pod_cols = [np.array(c, dtype=np.int64) for c in zip(*pods, strict=True)] if pods else [_EMPTY] * 4
        slot_cols = [np.array(c, dtype=np.int64) for c in zip(*slots, strict=True)] if slots else [_EMPTY] * 5
        return cls(*pod_cols, *slot_cols)

    @classmethod
    def union(cls, parts: Sequence[Footprint]) -> Footprint:
        """All the rows of several footprints (freeing it frees what each would)."""
        return cls(*(np.concatenate([getattr(fp, f) for fp in parts]) for f in cls.__dataclass_fields__))

    def select(self, tags: np.ndarray) -> Footprint:
        """Only the rows of the groups where `tags` (a boolean per group) is true."""
        p, s = tags[self.pod_tag], tags[self.slot_tag]
        return Footprint(
            self.pod_node[p], self.pod_cpu[p], self.pod_mem[p], self.pod_tag[p],
            self.slot_node[s], self.slot_idx[s], self.slot_cores[s], self.slot_mem[s], self.slot_tag[s],
        )  # fmt: skip


_EMPTY = np.zeros(0, dtype=np.int64)

_ARRAYS = (
    "cpu_free",
    "mem_free",
    "gpu_cores_free",
    "gpu_mem_free",
    "gpu_tasks",
    "gpu_exclusive",
    "gpu_idle",
    "node_idle_gpus",
    "node_cores_free",
    "node_version",
)
_SHARED = (
    "nodes",
    "node_names",
    "node_index",
    "models",
    "cpu_cap",
    "mem_cap",
    "split",
    "gpu_split",
    "schedulable",
    "gpu_valid",
    "gpu_healthy",
    "gpu_model",
    "gpu_mem_cap",
    "gpu_cores_cap",
    "gpu_usable",
    "gpu_numa",
    "gpu_whole",
    "uniform_cores",
    "node_cores_cap",
    "_unplaceable",
)


class ClusterState:
    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        self.nodes = list(nodes)
        n = len(self.nodes)
        g = max((len(nd.gpus) for nd in self.nodes), default=0)
        self.node_names = [nd.name for nd in self.nodes]
        self.node_index = {name: i for i, name in enumerate(self.node_names)}
        if len(self.node_index) != n:
            raise InputError("node names must be unique")
        self.models: list[str] = sorted({gpu.model for nd in self.nodes for gpu in nd.gpus})
        model_id = {m: i for i, m in enumerate(self.models)}

        self.cpu_cap = np.array([nd.cpu_m for nd in self.nodes], dtype=np.int64)
        self.mem_cap = np.array([nd.memory_mib for nd in self.nodes], dtype=np.int64)
        self.split = np.array([nd.split_count for nd in self.nodes], dtype=np.int32)
        self.schedulable = np.array([nd.schedulable for nd in self.nodes], dtype=bool)
        self.gpu_valid = np.zeros((n, g), dtype=bool)
        self.gpu_healthy = np.zeros((n, g), dtype=bool)
        self.gpu_model = np.full((n, g), -1, dtype=np.int32)
        self.gpu_mem_cap = np.zeros((n, g), dtype=np.int64)
        self.gpu_split = np.zeros((n, g), dtype=np.int32)  # tasks each card may hold
        self.gpu_cores_cap = np.zeros((n, g), dtype=np.int32)  # HAMi's devcore (100 × deviceCoreScaling)
        self.gpu_numa = np.zeros((n, g), dtype=np.int32)
        for i, nd in enumerate(self.nodes):
            for j, dev in enumerate(nd.gpus):
                self.gpu_split[i, j] = dev.split or nd.split_count
                self.gpu_valid[i, j] = True
                self.gpu_healthy[i, j] = dev.healthy
                self.gpu_model[i, j] = model_id[dev.model]
                self.gpu_mem_cap[i, j] = dev.memory_mib
                self.gpu_cores_cap[i, j] = dev.cores
                self.gpu_numa[i, j] = dev.numa
        # HAMi's Fit makes a cores-100 task exclusive only on a card of exactly 100 cores (devcore); with
        # deviceCoreScaling ≠ 1 it is an ordinary share of the card's cores.
        self.gpu_whole = self.gpu_valid & (self.gpu_cores_cap == GPU_CORES)
        self.uniform_cores = bool(np.array_equal(self.gpu_whole, self.gpu_valid))

        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.gpu_cores_free = self.gpu_cores_cap.copy()
        self.gpu_mem_free = self.gpu_mem_cap.copy()
        self.gpu_tasks = np.zeros((n, g), dtype=np.int32)
        self.gpu_exclusive = np.zeros((n, g), dtype=bool)
        # Usable GPUs with nothing on them, kept current so whole-GPU pods filter on (n,) not (n, g).
        self.gpu_idle = self.gpu_valid & self.gpu_healthy
        self.node_idle_gpus = self.gpu_idle.sum(axis=1).astype(np.int32)
        self.gpu_usable = self.gpu_valid & self.gpu_healthy
        self.node_cores_cap = self.gpu_cores_cap.sum(axis=1).astype(np.int64)
        self.node_cores_free = self.node_cores_cap.copy()
        # Bumped on every assign/release on a node, so scorers that cache per-node work see what changed.
        self.node_version = np.zeros(n, dtype=np.int64)
        self._ledger: dict[str, Placement] = {}
        self._unplaceable: dict[tuple[Any, ...], str | None] = {}

    def copy(self) -> ClusterState:
        """An independent copy (arrays and ledger) for dry runs; node specs are shared, read-only."""
        new = object.__new__(ClusterState)
        for name in _ARRAYS:
            setattr(new, name, getattr(self, name).copy())
        for name in _SHARED:
            setattr(new, name, getattr(self, name))
        new._ledger = dict(self._ledger)
        return new

    def without(self, fp: Footprint) -> ClusterState:
        """A dry-run copy with a footprint's resources freed, in a few vectorised updates (the ledger is
        not changed: the copy answers "what would fit", it is never committed)."""
        new = self.copy()
        np.add.at(new.cpu_free, fp.pod_node, fp.pod_cpu)
        np.add.at(new.mem_free, fp.pod_node, fp.pod_mem)
        if len(fp.slot_node):
            n, s, cores = fp.slot_node, fp.slot_idx, fp.slot_cores
            np.add.at(new.gpu_cores_free, (n, s), cores)
            np.add.at(new.gpu_mem_free, (n, s), fp.slot_mem)
            np.add.at(new.gpu_tasks, (n, s), -1)
            np.add.at(new.node_cores_free, n, cores)
            whole = (cores >= GPU_CORES) & new.gpu_whole[n, s]
            new.gpu_exclusive[n[whole], s[whole]] = False
            new.gpu_idle = new.gpu_usable & (new.gpu_tasks == 0)
            new.node_idle_gpus = new.gpu_idle.sum(axis=1).astype(np.int32)
        return new

    # -- sizes --------------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def total_gpus(self) -> int:
        return int(self.gpu_valid.sum())

    def mean_gpu_memory_mib(self) -> float:
        return float(self.gpu_mem_cap.sum() / max(1, self.total_gpus))

    def capacity_vector(self) -> np.ndarray:
        """Cluster capacity over the fair dimensions (gpu, gpumem, cpu, memory). GPUs count in the unit pods are
        charged in, GPU-equivalents of 100 cores: a card of devcore 200 (deviceCoreScaling 2) holds two."""
        return np.array(
            [self.gpu_cores_cap.sum() / GPU_CORES, self.gpu_mem_cap.sum(), self.cpu_cap.sum(), self.mem_cap.sum()],
            dtype=np.float64,
        )

    def model_slots(self, allows: Callable[[str], bool]) -> np.ndarray:
        """(N, G) bool: real GPU slots whose model passes `allows`."""
        allowed = np.array([allows(m) for m in self.models] + [False], dtype=bool)  # index -1: no GPU
        return allowed[self.gpu_model] & self.gpu_valid

    def unplaceable_reason(self, pod: PodSpec) -> str | None:
        """Why no node could ever hold the pod, even with the cluster empty; None if some node could."""
        key = pod.key()
        if key not in self._unplaceable:  # capacity never changes, and pod shapes repeat
            self._unplaceable[key] = self._unplaceable_now(pod)
        return self._unplaceable[key]

    def _unplaceable_now(self, pod: PodSpec) -> str | None:
        ok = self.cpu_cap >= pod.cpu_m
        if not ok.any():
            return f"cpu request {pod.cpu_m}m is more than any node has"
        ok &= self.mem_cap >= pod.memory_mib
        if not ok.any():
            return f"memory request {pod.memory_mib}Mi is more than any node has"
        g = pod.gpu
        if g is None:
            return None
        slots = self.model_slots(pod.allows_model)
        if not slots.any():
            return "no GPU in the cluster is of an allowed model"
        slots &= self.gpu_mem_cap >= g.mem_mib
        if not (ok & (slots.sum(axis=1) >= g.count)).any():
            each = f" with nvidia.com/gpumem {g.mem_mib} MiB each" if g.mem_mib else ""
            return f"nvidia.com/gpu {g.count}{each} is more than any node has"
        return None

    def allocated_gpu_equivalents(self) -> float:
        return float((self.gpu_cores_cap - self.gpu_cores_free).sum()) / GPU_CORES

    # -- mutation -----------------------------------------------------------------------------------
    def placement_for(
        self, pod: PodSpec, node: int, slots: Sequence[int] | np.ndarray, segments: tuple[int, ...] = ()
    ) -> Placement:
        """The Placement that pod would get on these slots of that node: its GPU containers' cards in turn,
        `segments` of them each (one container when empty)."""
        slots = tuple(int(s) for s in slots)
        if pod.gpu is None:
            return Placement(node=node, cpu_m=pod.cpu_m, memory_mib=pod.memory_mib)
        # What HAMi writes for the card: gpumem when given (an exclusive card included), else the percentage of
        # its memory. An exclusive card is closed to others by its cores, whatever memory it records.
        cores: list[int] = []
        mem: list[int] = []
        start = 0
        for g, size in zip(pod.gpus, segments or (len(slots),), strict=True):
            cap = self.gpu_mem_cap[node, list(slots[start : start + size])]
            mem += [int(m) for m in np.broadcast_to(g.mem_for(cap), cap.shape)]
            cores += [g.cores] * size
            start += size
        return Placement(node, slots, tuple(cores), tuple(mem), pod.cpu_m, pod.memory_mib, segments)

    def assign(self, key: str, p: Placement) -> None:
        if key in self._ledger:
            raise StateError(f"{key} is already placed")
        if not self.fits(p):
            raise StateError(f"{key} does not fit on node {self.node_names[p.node]}")
        self._apply(p, -1)
        self._ledger[key] = p

    def release(self, key: str) -> Placement:
        p = self._ledger.pop(key, None)
        if p is None:
            raise StateError(f"{key} is not placed")
        self._apply(p, +1)
        return p

    def placement(self, key: str) -> Placement | None:
        return self._ledger.get(key)

    def placed_keys(self) -> list[str]:
        return list(self._ledger)

    def fits(self, p: Placement) -> bool:
        """Whether a placement fits now, under HAMi's per-card rules (`Fit`), each entry seeing the ones
        before it as HAMi's scheduler fits a pod's containers in turn."""
        i = p.node
        if not (0 <= i < self.num_nodes) or self.cpu_free[i] < p.cpu_m or self.mem_free[i] < p.memory_mib:
            return False
        if not len(p.slots) == len(p.cores) == len(p.mem_mib) or sum(p.segments) not in (0, len(p.slots)):
            return False
        for entries in p.containers():
            if len({p.slots[e] for e in entries}) != len(entries):
                return False  # one container never gets two slots of one GPU
        used: dict[int, tuple[int, int, int, bool]] = {}  # slot → (tasks, free cores, free MiB, exclusive)
        for s, c, m in zip(p.slots, p.cores, p.mem_mib, strict=True):
            if not (0 <= s < self.gpu_valid.shape[1]) or not (self.gpu_valid[i, s] and self.gpu_healthy[i, s]):
                return False
            tasks, free_cores, free_mem, exclusive = used.get(
                s, (int(self.gpu_tasks[i, s]), int(self.gpu_cores_free[i, s]), int(self.gpu_mem_free[i, s]),
                    bool(self.gpu_exclusive[i, s]))
            )  # fmt: skip
            whole = bool(self.gpu_whole[i, s])
            if exclusive or tasks >= self.gpu_split[i, s] or free_cores < c or free_mem < m:
                return False
            if whole and c >= GPU_CORES and tasks > 0:
                return False  # HAMi: cores 100 on a 100-core card wants it to itself
            if c == 0 and free_cores == 0 and self.gpu_cores_cap[i, s] != 0:
                return False  # HAMi: a 0-core task cannot land on a card whose cores are all taken
            used[s] = (tasks + 1, free_cores - c, free_mem - m, whole and c >= GPU_CORES)
        return True

    def _apply(self, p: Placement, sign: int) -> None:
        i = p.node
        self.node_version[i] += 1
        self.cpu_free[i] += sign * p.cpu_m
        self.mem_free[i] += sign * p.memory_mib
        if not p.slots:
            return
        s = np.asarray(p.slots, dtype=np.intp)
        cores = np.asarray(p.cores, dtype=np.int64)
        rows = np.full(len(s), i, dtype=np.intp)
        np.add.at(self.gpu_cores_free, (rows, s), sign * cores)
        self.node_cores_free[i] += sign * int(cores.sum())
        np.add.at(self.gpu_mem_free, (rows, s), sign * np.asarray(p.mem_mib, dtype=np.int64))
        np.add.at(self.gpu_tasks, (rows, s), -sign)
        whole = (cores >= GPU_CORES) & self.gpu_whole[i, s]
        self.gpu_exclusive[i, s[whole]] = sign < 0
        u = np.unique(s)
        idle = (self.gpu_tasks[i, u] == 0) & self.gpu_healthy[i, u]
        self.node_idle_gpus[i] += int(idle.sum()) - int(self.gpu_idle[i, u].sum())
        self.gpu_idle[i, u] = idle

    # -- checks -------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise StateError if the arrays disagree with the ledger or break a capacity rule."""
        cpu, mem = self.cpu_cap.copy(), self.mem_cap.copy()
        cores, gmem = self.gpu_cores_cap.copy(), self.gpu_mem_cap.copy()
        tasks = np.zeros_like(self.gpu_tasks)
        exclusive = np.zeros_like(self.gpu_exclusive)
        for p in self._ledger.values():
            cpu[p.node] -= p.cpu_m
            mem[p.node] -= p.memory_mib
            for s, c, m in zip(p.slots, p.cores, p.mem_mib, strict=True):
                cores[p.node, s] -= c
                gmem[p.node, s] -= m
                tasks[p.node, s] += 1
                exclusive[p.node, s] |= c >= GPU_CORES and self.gpu_whole[p.node, s]
        checks: dict[str, tuple[np.ndarray, np.ndarray]] = {
            "free CPU": (self.cpu_free, cpu),
            "free memory": (self.mem_free, mem),
            "free GPU cores": (self.gpu_cores_free, cores),
            "free GPU memory": (self.gpu_mem_free, gmem),
            "GPU task count": (self.gpu_tasks, tasks),
        }
        for what, (have, want) in checks.items():
            if not np.array_equal(have, want):
                raise StateError(f"{what} disagrees with the placements held")
            if (have < 0).any():
                raise StateError(f"{what} is negative")
        if (tasks[exclusive] != 1).any():
            raise StateError("a whole-GPU pod shares its GPU")
        if not np.array_equal(exclusive, self.gpu_exclusive):
            raise StateError("exclusive marks disagree with the placements held")
        if (tasks > self.gpu_split).any():
            raise StateError("a GPU holds more tasks than its split count")
        idle = self.gpu_valid & self.gpu_healthy & (tasks == 0)
        if not np.array_equal(idle, self.gpu_idle) or not np.array_equal(idle.sum(1), self.node_idle_gpus):
            raise StateError("idle-GPU index disagrees with the placements held")
        if not np.array_equal(cores.sum(axis=1), self.node_cores_free):
            raise StateError("per-node free GPU cores disagree with the placements held")
