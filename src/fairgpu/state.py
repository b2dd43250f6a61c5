"""ClusterState: free capacity of every node and GPU slot in numpy arrays, assign/release, invariants.

Nodes are rows; GPU slots are columns (padded to the largest node, `gpu_valid` marks real ones).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from fairgpu.changes import Changes
from fairgpu.dry_run import Journal
from fairgpu.errors import InputError, StateError
from fairgpu.mig_slices import MigSlices
from fairgpu.model.mig import MigTable
from fairgpu.model.node import GPU_CORES, NodeSpec, exclusive_on
from fairgpu.model.placement import MIG_WHOLE as MIG_WHOLE
from fairgpu.model.placement import Footprint as Footprint
from fairgpu.model.placement import Placement as Placement
from fairgpu.model.pod import GpuRequest, PodSpec
from fairgpu.state_kernels import Booked, book


def scratch_key(*parts: object) -> str:
    """A ledger key for a dry-run placement on a copy of the state (reservations, replays, explanations).
    It starts with NUL, so it never collides with a pod's key (namespace/name) or another dry run's."""
    return "\0" + "-".join(str(p) for p in parts)


_NO_ENTRIES = np.zeros(0, dtype=np.int64)  # a placement without GPU entries (never written)
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
    "mig_busy",
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
    "gpu_mig",
    "has_mig",
    "mig_mem",
    "mig_cores",
    "mig_mask",
    "mig",
    "has_pairs",
    "gpu_pair",
    "node_cores_cap",
    "_unplaceable",
    "_card_rules",
)


class ClusterState(MigSlices):
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
        # cards a cores-100 task takes to itself (model.node.exclusive_on)
        self.gpu_whole = self.gpu_valid & (self.gpu_cores_cap == GPU_CORES)
        self.uniform_cores = bool(np.array_equal(self.gpu_whole, self.gpu_valid))
        table = MigTable.of([[(d.mode, d.mig) for d in nd.gpus] for nd in self.nodes], g)
        self.has_mig, self.gpu_mig, self.mig_mem, self.mig_cores, self.mig_mask = table.fields()
        self.mig = table
        # HAMi's GPU pair scores (topology-aware policy): (N, G, G), row j's score of card l; zeros when none
        self.has_pairs = any(nd.pair_scores for nd in self.nodes)
        self.gpu_pair = np.zeros((n, g, g) if self.has_pairs else (n, 0, 0), dtype=np.int64)
        for i, nd in enumerate(self.nodes):
            if nd.pair_scores:
                k = len(nd.gpus)
                self.gpu_pair[i, :k, :k] = nd.pair_scores
        diagonal = np.arange(self.gpu_pair.shape[1])
        self.gpu_pair[:, diagonal, diagonal] = 0  # HAMi never scores a card with itself
        self.mig_busy = np.zeros((n, g), dtype=np.int64)  # MIG slices in use, a bit per slice

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
        # Every node an assign/release (or a dry run) changes, in order, so caches of per-node work
        # recompute only those; `version` (the log's end) says in one comparison that nothing did.
        self.changes = Changes(n)
        self._ledger: dict[str, Placement] = {}
        self._journals: list[Journal] = []  # open dry runs, innermost last
        self._unplaceable: dict[tuple[Any, ...], str | None] = {}
        # each card's fixed facts the booking reads, side by side: one array is one argument less to pass
        # (numba's call costs ~60 ns an array); they never change after this
        self._card_rules = np.stack(
            [self.gpu_usable, self.gpu_healthy, self.gpu_whole, self.gpu_split, self.gpu_cores_cap], axis=-1
        ).astype(np.int32)
        self._booking = self._booked_arrays()
        self.fits(Placement(0))  # loads the compiled booking now, not at the first placement

    def _booked_arrays(self) -> Booked:
        """The arrays `state_kernels.book` reads and writes, in its order."""
        return (
            self.cpu_free, self.mem_free, self.node_idle_gpus, self.node_cores_free, self.gpu_cores_free,
            self.gpu_mem_free, self.gpu_tasks, self.gpu_exclusive, self.gpu_idle, self._card_rules,
        )  # fmt: skip

    def copy(self) -> ClusterState:
        """An independent copy (arrays and ledger) for dry runs; node specs are shared, read-only."""
        new = object.__new__(ClusterState)
        for name in _ARRAYS:
            setattr(new, name, getattr(self, name).copy())
        for name in _SHARED:
            setattr(new, name, getattr(self, name))
        new._ledger = dict(self._ledger)
        new.changes = self.changes.fork()
        new._journals = []
        new._booking = new._booked_arrays()
        return new

    def without(self, fp: Footprint) -> ClusterState:
        """A dry-run copy with a footprint's resources freed, in a few vectorised updates (the ledger is
        not changed: the copy answers "what would fit", it is never committed)."""
        new = self.copy()
        new._free(fp)
        return new

    @contextmanager
    def dry_run(self, freed: Footprint | None = None) -> Iterator[ClusterState]:
        """This very state, with a footprint's resources freed, for a dry run that may assign and release:
        on leaving the block every array and the ledger are as they were (dry runs nest). Unlike a copy it
        keeps what caches keyed by this state know (filter and score results, a score plugin's per-node
        sums): only the nodes the dry run touched are recomputed, in it and after it, as `changes`
        lists them."""
        journal = Journal(self.num_nodes, _ARRAYS)
        self._journals.append(journal)
        try:
            if freed is not None and len(freed.pod_node):
                nodes = np.concatenate([freed.pod_node, freed.slot_node])
                journal.save(self, nodes)
                self._free(freed)
                self.changes.extend(nodes)
            yield self
        finally:
            self._journals.pop()
            journal.undo(self)

    def _free(self, fp: Footprint) -> None:
        """Free a footprint's resources in place (the ledger and versions are the caller's)."""
        np.add.at(self.cpu_free, fp.pod_node, fp.pod_cpu)
        np.add.at(self.mem_free, fp.pod_node, fp.pod_mem)
        if not len(fp.slot_node):
            return
        n, s, cores = fp.slot_node, fp.slot_idx, fp.slot_cores
        # on the flat arrays, in their own dtypes: ufunc.at on 2-D indices or with a cast is far slower
        flat = n * self.gpu_valid.shape[1] + s
        np.add.at(self.gpu_cores_free.reshape(-1), flat, cores.astype(self.gpu_cores_free.dtype))
        np.add.at(self.gpu_mem_free.reshape(-1), flat, fp.slot_mem.astype(self.gpu_mem_free.dtype))
        np.add.at(self.gpu_tasks.reshape(-1), flat, self.gpu_tasks.dtype.type(-1))
        np.add.at(self.node_cores_free, n, cores)
        whole = exclusive_on(cores, self.gpu_whole[n, s])
        self.gpu_exclusive[n[whole], s[whole]] = False
        rows = np.zeros(self.num_nodes, dtype=bool)
        rows[n] = True
        self.gpu_idle[rows] = self.gpu_usable[rows] & (self.gpu_tasks[rows] == 0)
        self.node_idle_gpus[rows] = self.gpu_idle[rows].sum(axis=1)
        if (fp.slot_mig != -1).any():
            self._free_mig(fp)

    @property
    def version(self) -> int:
        """Moves on whenever a node changes (the change log's end)."""
        return self.changes.end

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

    def takes_whole_cards(self, g: GpuRequest) -> bool:
        """Whether the request takes each of its cards to itself whichever cards it gets: cores 100 where every
        card has 100 cores. Otherwise its cards are shares, told apart card by card (a cores-100 task alone
        only on 100-core cards): the filter, the scores and the card order go per card."""
        return bool(exclusive_on(g.cores, self.uniform_cores))

    def allocated_gpu_equivalents(self) -> float:
        return float((self.gpu_cores_cap - self.gpu_cores_free).sum()) / GPU_CORES

    # -- mutation -----------------------------------------------------------------------------------
    def placement_for(
        self, pod: PodSpec, node: int, slots: Sequence[int] | np.ndarray, segments: tuple[int, ...] = ()
    ) -> Placement:
        """The Placement that pod would get on these slots of that node: its GPU containers' cards in turn,
        `segments` of them each (one container when empty)."""
        slots = tuple(slots.tolist() if isinstance(slots, np.ndarray) else (int(s) for s in slots))
        g = pod.gpu
        if g is None:
            return Placement(node=node, cpu_m=pod.cpu_m, memory_mib=pod.memory_mib)
        if not self.has_mig and not pod.more_gpus:  # one container, no MIG card: in scalar steps
            n = len(slots)
            if g.mem_mib:
                mem_n = (g.mem_mib,) * n
            else:
                mem_n = tuple([self.gpu_mem_cap.item(node, s) * g.mem_pct // 100 for s in slots])
            return Placement(node, slots, (g.cores,) * n, mem_n, pod.cpu_m, pod.memory_mib, segments)
        # What HAMi writes for the card: gpumem when given (an exclusive card included), else the percentage of
        # its memory. An exclusive card is closed to others by its cores, whatever memory it records.
        cores: list[int] = []
        mem: list[int] = []
        mig: list[int] = []
        busy: dict[int, int] = {}  # MIG slices taken by this pod's earlier containers, per card
        start = 0
        for g, size in zip(pod.gpus, segments or (len(slots),), strict=True):
            cap = self.gpu_mem_cap[node, list(slots[start : start + size])]
            for s, m in zip(slots[start : start + size], np.broadcast_to(g.mem_for(cap), cap.shape), strict=True):
                c = self._mig_for(node, s, int(m), busy)
                if c < 0:  # an ordinary card: what the request says
                    mem.append(int(m))
                    cores.append(g.cores)
                else:  # a MIG card: what HAMi's AddResourceUsage books, the chosen profile's memory and cores
                    mem.append(int(self.mig_mem[node, s, c]))
                    cores.append(int(self.mig_cores[node, s, c]))
                    busy[s] = busy.get(s, 0) | int(self.mig_mask[node, s, c])
                mig.append(c)
            start += size
        return Placement(
            node, slots, tuple(cores), tuple(mem), pod.cpu_m, pod.memory_mib, segments,
            tuple(mig) if any(c >= 0 for c in mig) else (),
        )  # fmt: skip

    def assign(self, key: str, p: Placement) -> None:
        if key in self._ledger:
            raise StateError(f"{key} is already placed")
        entries = self._entries(p)
        # checked and booked in one call; in a dry run the journal first saves the node as it was
        journal = self._journals[-1] if self._journals else None
        sign = 0 if journal else -1
        if entries is None or not book(
            *self._booking, p.node, entries, p.cpu_m, p.memory_mib, sign, True, not p.segments
        ):
            raise StateError(f"{key} does not fit on node {self.node_names[p.node]}")
        if journal:
            journal.changing(self, key, p.node)
            book(*self._booking, p.node, entries, p.cpu_m, p.memory_mib, -1, False, False)
        self.changes.add(p.node)
        if p.mig:
            self._apply_mig(p, -1)
        self._ledger[key] = p

    def release(self, key: str) -> Placement:
        p = self._ledger.pop(key, None)
        if p is None:
            raise StateError(f"{key} is not placed")
        if self._journals:
            self._journals[-1].changing(self, key, p.node, p)
        self._apply(p, +1)
        return p

    def placement(self, key: str) -> Placement | None:
        return self._ledger.get(key)

    def placed_keys(self) -> list[str]:
        return list(self._ledger)

    def fits(self, p: Placement) -> bool:
        """Whether a placement fits now, under HAMi's per-card rules (`Fit`), each entry seeing the ones
        before it as HAMi's scheduler fits a pod's containers in turn."""
        entries = self._entries(p)
        return entries is not None and book(
            *self._booking, p.node, entries, p.cpu_m, p.memory_mib, 0, True, not p.segments
        )

    def _entries(self, p: Placement) -> np.ndarray | None:
        """The placement's entries for `state_kernels.book` (slots, then cores, then MiB), or None when it
        fails a check of `fits` other than the card rules: entries that do not line up, two slots of one GPU
        in one container, or MIG candidates that are not there to take."""
        slots = p.slots
        if not len(slots) == len(p.cores) == len(p.mem_mib) or sum(p.segments) not in (0, len(slots)):
            return None
        if p.segments:  # (one container's slots are told apart by the kernel)
            for entries in p.containers():
                if len({slots[e] for e in entries}) != len(entries):
                    return None  # one container never gets two slots of one GPU
        if p.mig and len(p.mig) != len(slots):
            return None
        if not self.has_mig:
            if p.mig and max(p.mig) >= 0:
                return None  # no MIG card: an entry may name no MIG candidate (MigSlices._mig_entry_fits)
        elif 0 <= p.node < self.num_nodes:
            slices: dict[int, int] = {}  # MIG slices taken, this placement's entries included
            for e, (s, c, m) in enumerate(zip(slots, p.cores, p.mem_mib, strict=True)):
                if not self._mig_entry_fits(p.node, s, c, m, p.mig[e] if p.mig else -1, slices):
                    return None
        return np.array(slots + p.cores + p.mem_mib, dtype=np.int64) if slots else _NO_ENTRIES

    def _apply(self, p: Placement, sign: int) -> None:
        self.changes.add(p.node)
        entries = np.array(p.slots + p.cores + p.mem_mib, dtype=np.int64) if p.slots else _NO_ENTRIES
        book(*self._booking, p.node, entries, p.cpu_m, p.memory_mib, sign, False, False)
        if p.mig:
            self._apply_mig(p, sign)

    # -- checks -------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise StateError if the arrays disagree with the ledger or break a capacity rule."""
        cpu, mem = self.cpu_cap.copy(), self.mem_cap.copy()
        cores, gmem = self.gpu_cores_cap.copy(), self.gpu_mem_cap.copy()
        tasks = np.zeros_like(self.gpu_tasks)
        exclusive = np.zeros_like(self.gpu_exclusive)
        self._check_mig()
        for p in self._ledger.values():
            cpu[p.node] -= p.cpu_m
            mem[p.node] -= p.memory_mib
            for s, c, m in zip(p.slots, p.cores, p.mem_mib, strict=True):
                cores[p.node, s] -= c
                gmem[p.node, s] -= m
                tasks[p.node, s] += 1
                exclusive[p.node, s] |= exclusive_on(c, self.gpu_whole[p.node, s])
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
