"""Score plugin: Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation", USENIX ATC 2023).

A node's fragmentation for the workload mix is the expected GPU capacity (in percent of a GPU) that a pod
drawn from the mix could not use there: all of the node's free GPU capacity when the pod cannot fit at all
(too little CPU, too few GPUs with room, no allowed model), else the free capacity of the GPUs too full to
take it. A pod goes where it increases this the least, and on that node to the GPU that does.

The mix is learned online from the pods placed for real so far (no look at pods not yet seen, nor at dry
runs), each pod counted once however often it is tried (`learn`). Per node and shape
the plugin keeps how many GPUs could take the shape and how much free capacity they hold, and per pod shape
the change each node would see; both are brought up to date only for nodes whose state changed since
(ClusterState.changes), so after one placement a score recomputes one node.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fairgpu.framework.interfaces import EngineView, FitMask
from fairgpu.model.node import GPU_CORES
from fairgpu.model.pod import PodSpec
from fairgpu.plugins import fragmentation_kernels as kernels
from fairgpu.plugins.kernel_warmup import exercise
from fairgpu.state import ClusterState

_CACHED_SHAPES = 512
_NO_ROWS = np.zeros(0, dtype=np.int64)
# pod keys already counted into the mix, least recently tried first: a pod tried again after this many
# other pods were first tried counts a second time (memory stays bounded in a controller that runs for months)
_REMEMBERED = 1 << 16
_SETTINGS = ("quantize", "by_demand", "cpu_balance", "scarce", "pressure", "memory", "max_shapes", "compiled")
_WARMED: set[tuple[Any, ...]] = set()  # plugin settings whose kernels this process has loaded


def _shape(pod: PodSpec, memory: bool) -> tuple[Any, ...]:
    g = pod.gpu
    mem = pod.memory_mib if memory else 0
    return (pod.cpu_m, mem, g.count if g else 0, g.cores if g else 0, pod.gpu_include, pod.gpu_exclude)


@dataclass(slots=True)
class _Aggregates:
    """Per-node sums for every known shape, valid for `free`/`cpu` as they were when computed."""

    state: ClusterState
    free: np.ndarray  # (N, G) free cores of usable GPUs, 0 elsewhere
    cpu: np.ndarray  # (N,)
    mem: np.ndarray  # (N,) free memory (MiB), or zeros when the measure leaves memory out
    fit_count: np.ndarray  # (N, T) GPUs with room for the shape
    fit_free: np.ndarray  # (N, T) free cores on those GPUs (float32: half the memory traffic)
    access: np.ndarray  # (N, T) node has a GPU of an allowed model
    hosts: np.ndarray  # (T,) nodes where each shape fits now
    room: np.ndarray  # (T,) free GPU cores, cluster-wide, on nodes where each shape fits now
    free_total: np.ndarray  # (1,) free cores of usable GPUs, cluster-wide
    at: int  # the state's version when last brought up to date
    usable: np.ndarray | None = None  # (N,) expected usable free capacity under the current weights
    # (N,) cpu_balance's CPU per GPU percent that each node's free GPUs need, and the price of one starved
    # percent there, valid with `usable`
    need: np.ndarray = field(default_factory=lambda: np.zeros(0))
    price: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # pod key → (the state's version when computed, (N,) change in fragmentation per node): pod shapes
    # repeat, and between two placements only the nodes that changed need scoring again
    deltas: dict[tuple[Any, ...], tuple[int, np.ndarray]] = field(default_factory=dict)


def _free_cores(state: ClusterState, rows: np.ndarray | slice) -> np.ndarray:
    return np.where(state.gpu_usable[rows], state.gpu_cores_free[rows], 0).astype(np.int64)


@dataclass(slots=True)
class Fragmentation:
    NAME: ClassVar[str] = "Fragmentation"
    # FGD's own integer node scores (0..100, ties then go to the next score plugin); False keeps the
    # exact expected change, which separates placements FGD's rounding calls equal.
    quantize: bool = False
    # weigh each shape by the GPUs its pods ask for rather than by how many pods ask: a blocked k-GPU pod
    # leaves k GPUs of demand unserved. (That it also needs k GPUs on one node is `pressure`'s part: the
    # square of the GPUs, used before, kept whole nodes for 8-GPU pods even while hundreds were whole, and so
    # sent small pods to the models that GPU-constrained pods needed.)
    by_demand: bool = False
    # weight of a second, CPU-side measure: GPU capacity a node's free CPU cannot feed at the CPU its free GPUs
    # are expected to need. FGD sees CPU only once a node falls below a whole shape's need; this sees CPU
    # draining from GPU-rich nodes before that (0 = FGD's measure alone). A node's need per GPU is that of the
    # pods that can use its free GPUs: the learned shapes with a model it has, enough GPUs with room and
    # enough memory there, by their GPU demand (their CPU over their GPUs), plus the CPU-only pods' CPU per
    # GPU of the whole mix (they arrive in proportion to the GPU pods and may take CPU from any node). So a
    # 128-core node whose free GPUs only a CPU-heavy 8-GPU shape can use keeps its cores for it, and 36 cores
    # beside 4 GPUs that only light shapes can use are priced at those shapes' need, not at the mix's.
    cpu_balance: float = 0.0
    # a shape that fits on fewer than this many nodes weighs more (×2 each time its hosts halve, up to this
    # factor): FGD's measure is node-local and cannot see that breaking one of the last few nodes able to
    # take a shape (say, the only ones with 120 cores beside 8 GPUs) costs more than breaking one of
    # hundreds alike (0 = FGD's weights alone)
    scarce: int = 0
    # weigh a shape up by the cluster's free GPU capacity over the part of it the shape can use (nodes where
    # it fits: a model it allows, enough GPUs free, CPU and, with `memory`, memory), to a power of two, up to
    # this factor: a shape's demand lands only on capacity it can use, so a unit of that capacity is worth
    # demand / usable capacity. A shape that allows a model holding a tenth of the free GPUs weighs ten times
    # its share of the mix there, and pods that may go anywhere leave it to that shape; an 8-GPU shape asking
    # 120 cores, which only the few 128-core nodes can host, weighs up from the start (0 = off)
    pressure: int = 0
    # a node's free GPUs count as lost to a shape when its free memory cannot host the shape, as FGD counts
    # them for CPU: a pod taking memory strands the GPUs of the shapes that needed it just as one taking CPU
    # does (FGD's own measure, the `fgd` baseline, sees CPU only)
    memory: bool = False
    max_shapes: int = 128
    # the inner loops compiled (fragmentation_kernels.py); False runs the NumPy path, bit for bit the same
    compiled: bool = True
    _keys: dict[tuple[Any, ...], int] = field(default_factory=dict)
    _count: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _cpu: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _mem: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _k: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _need: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _pods: list[PodSpec] = field(default_factory=list)
    _learned: OrderedDict[str, None] = field(default_factory=OrderedDict)
    # CPU (millicores) of CPU-only pods and GPU capacity (percent) of GPU pods, and per shape its pods' CPU and
    # GPU capacity: integers summed in float64, so exact in any order (the kernels sum them in a loop)
    _cpu_only: float = 0.0
    _gpu_pct: float = 0.0
    _shape_cpu: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _shape_gpu: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # Shape weights in use, refreshed when a shape appears or the counts grew by a quarter since: between
    # refreshes each node's current usable capacity stays cached and only changed nodes are recomputed.
    _p: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    _w: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))  # _p with scarcity boosts
    _p_total: float = 0.0
    # cpu_balance's sums, refreshed with _p: per shape its pods' CPU and GPU capacity, and CPU-only pods'
    # millicores per GPU percent of all GPU pods
    _need_cpu: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _need_gpu: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _cpu_only_per_core: float = 0.0
    _agg: _Aggregates | None = None
    # bumped whenever cached deltas go stale wholesale (new weights, new aggregates): the engine then
    # rescores every node, else only nodes whose state changed
    _generation: int = 0

    def __post_init__(self) -> None:
        if self.max_shapes < 1:
            raise ValueError("max_shapes must be at least 1")
        if self.compiled:  # load the kernels now, not at the first decisions: once per process and settings
            settings = {name: getattr(self, name) for name in _SETTINGS}
            if tuple(settings.values()) not in _WARMED:
                _WARMED.add(tuple(settings.values()))
                exercise(Fragmentation(**settings))  # a fresh plugin: this one learns nothing from it

    # -- the workload mix ---------------------------------------------------------------------------
    def learn(self, key: str, pod: PodSpec) -> None:
        """Count the pod into the mix once, however often it is tried: the mix is the shapes that arrive,
        and a pod retried every cycle or with every gang attempt is one arrival, not one per try. A pod
        deleted before it was placed stays counted, like one that ran and finished: it arrived, and what
        arrives is what the measure keeps room for (taking it out would drop exactly the shapes the cluster
        fails to serve)."""
        if key in self._learned:
            self._learned.move_to_end(key)
            return
        self._learned[key] = None
        if len(self._learned) > _REMEMBERED:
            self._learned.popitem(last=False)
        self._learn(pod.as_one_container())  # a pod of several GPU containers by its whole request

    def _learn(self, pod: PodSpec) -> None:
        if pod.gpu is None:
            self._cpu_only += pod.cpu_m  # see cpu_balance
            return  # CPU-only pods leave every node's GPU fragmentation as it is
        gpu_pct = pod.gpu.count * pod.gpu.cores
        self._gpu_pct += gpu_pct
        key = _shape(pod, self.memory)
        t = self._keys.get(key)
        if t is None:
            if len(self._keys) >= self.max_shapes:
                return
            t = self._keys[key] = len(self._keys)
            self._count = np.append(self._count, 0.0)
            self._cpu = np.append(self._cpu, pod.cpu_m)
            self._mem = np.append(self._mem, pod.memory_mib if self.memory else 0)
            self._k = np.append(self._k, pod.gpu.count)
            # a GPU takes a shape when its free cores cover the shape's (HAMi: a 0-core task needs > 0)
            self._need = np.append(self._need, max(pod.gpu.cores, 1))
            self._shape_cpu = np.append(self._shape_cpu, 0.0)
            self._shape_gpu = np.append(self._shape_gpu, 0.0)
            self._pods.append(pod)  # the aggregates gain its column when next brought up to date
            self._generation += 1
        self._count[t] += pod.gpu.gpu_equivalents() if self.by_demand else 1
        self._shape_cpu[t] += pod.cpu_m
        self._shape_gpu[t] += gpu_pct
        total = max(float(self._count.sum()), 1e-9)  # by demand, 0-core pods weigh nothing
        if self._agg is None or len(self._p) < len(self._count) or total > self._p_total * (1 + 1 / 4):
            self._p = (self._count / total).astype(np.float32)
            self._p_total = total
            self._need_cpu, self._need_gpu = self._shape_cpu.copy(), self._shape_gpu.copy()
            self._cpu_only_per_core = self._cpu_only / max(self._gpu_pct, 1.0)
            self._generation += 1
            if self._agg is not None:
                self._agg.usable = None
                self._agg.deltas.clear()

    # -- per-node aggregates ------------------------------------------------------------------------
    def _aggregates(self, state: ClusterState) -> _Aggregates:
        agg, cpu = self._agg, state.cpu_free
        if agg is not None and agg.state is state and agg.at == state.version and agg.usable is not None:
            return agg  # nothing changed since, weights included (new weights drop `usable`)
        mem = state.mem_free if self.memory else np.zeros_like(state.mem_free)
        if agg is None or agg.state is not state:
            free = _free_cores(state, slice(None))
            fit = free[:, :, None] >= self._need
            access = (
                np.stack([state.model_slots(p.allows_model).any(axis=1) for p in self._pods], axis=1)
                if self._pods
                else np.zeros((state.num_nodes, 0), dtype=bool)
            )
            fit_free = (fit * free[:, :, None]).sum(axis=1).astype(np.float32)
            none, total = np.zeros(0), np.array([free.sum()])
            agg = _Aggregates(
                state, free, cpu.copy(), mem.copy(), fit.sum(axis=1), fit_free, access, none, none, total, state.version
            )
            agg.hosts = self._ok(agg, slice(None), agg.fit_count, agg.cpu, agg.mem).sum(axis=0)
            agg.room = self._room(agg, slice(None), agg.fit_count, agg.fit_free, agg.cpu, agg.mem)
            self._agg = agg
            self._generation += 1
        elif agg.fit_count.shape[1] < len(self._need):
            self._extend(agg)
        rows = state.changes.since(agg.at) if agg.at != state.version else _NO_ROWS
        if rows.size:
            if self.compiled:
                kernels.refresh_rows(
                    rows, state.gpu_usable, state.gpu_cores_free, cpu, mem, self._need, self._k, self._cpu,
                    self._mem, agg.access, agg.free, agg.cpu, agg.mem, agg.fit_count, agg.fit_free, agg.hosts,
                    agg.room, agg.free_total,
                )  # fmt: skip
            else:
                self._refresh(agg, rows, _free_cores(state, rows), cpu[rows], mem[rows])
        if rows.size or agg.usable is None:  # the boosts follow `hosts` and `room`, which only refreshed rows move
            self._reweigh(agg)
        if agg.usable is not None and rows.size:
            agg.usable[rows] = self._after(agg, rows, 0, 0, 0, 0)
            if self.cpu_balance:
                agg.need[rows], agg.price[rows] = self._cpu_need(agg, rows)
        if agg.usable is None:
            every = np.arange(state.num_nodes)
            agg.usable = self._after(agg, every, 0, 0, 0, 0)
            agg.need, agg.price = self._cpu_need(agg, every) if self.cpu_balance else (every * 0.0, every * 0.0)
        agg.at = state.version
        return agg

    def _extend(self, agg: _Aggregates) -> None:
        """Columns for the shapes learned since the aggregates were built, from the node state they reflect
        (the same sums a fresh build makes, column by column; the rows refreshed next then cover them too)."""
        new = slice(agg.fit_count.shape[1], None)
        free = agg.free[:, :, None]
        fit = free >= self._need[new]
        fit_count, fit_free = fit.sum(axis=1), (fit * free).sum(axis=1).astype(np.float32)
        access = np.stack([agg.state.model_slots(p.allows_model).any(axis=1) for p in self._pods[new]], axis=1)
        ok = (
            (fit_count >= self._k[new]) & (agg.cpu[:, None] >= self._cpu[new]) & (agg.mem[:, None] >= self._mem[new])
        ) & access
        agg.fit_count = np.hstack([agg.fit_count, fit_count])
        agg.fit_free = np.hstack([agg.fit_free, fit_free])
        agg.access = np.hstack([agg.access, access])
        agg.hosts = np.concatenate([agg.hosts, ok.sum(axis=0)])
        agg.room = np.concatenate([agg.room, (ok * fit_free).sum(axis=0, dtype=np.float64)])

    def _refresh(self, agg: _Aggregates, rows: np.ndarray, free: np.ndarray, cpu: np.ndarray, mem: np.ndarray) -> None:
        """The NumPy path of kernels.refresh_rows: these rows' aggregates from their free cores, CPU and memory,
        and `hosts` and `room` moved with them."""
        fit = free[:, :, None] >= self._need
        agg.hosts -= self._ok(agg, rows, agg.fit_count[rows], agg.cpu[rows], agg.mem[rows]).sum(axis=0)
        agg.room -= self._room(agg, rows, agg.fit_count[rows], agg.fit_free[rows], agg.cpu[rows], agg.mem[rows])
        agg.fit_count[rows] = fit.sum(axis=1)
        agg.fit_free[rows] = (fit * free[:, :, None]).sum(axis=1)
        agg.free_total += free.sum() - agg.free[rows].sum()
        agg.free[rows], agg.cpu[rows], agg.mem[rows] = free, cpu, mem
        agg.hosts += self._ok(agg, rows, agg.fit_count[rows], agg.cpu[rows], agg.mem[rows]).sum(axis=0)
        agg.room += self._room(agg, rows, agg.fit_count[rows], agg.fit_free[rows], agg.cpu[rows], agg.mem[rows])

    def _ok(
        self, agg: _Aggregates, rows: np.ndarray | slice, fit_count: np.ndarray, cpu: np.ndarray, mem: np.ndarray
    ) -> np.ndarray:
        """(rows, T): each shape fits on the node."""
        return np.asarray(
            (fit_count >= self._k) & (cpu[:, None] >= self._cpu) & (mem[:, None] >= self._mem) & agg.access[rows]
        )

    def _room(
        self,
        agg: _Aggregates,
        rows: np.ndarray | slice,
        fit_count: np.ndarray,
        fit_free: np.ndarray,
        cpu: np.ndarray,
        mem: np.ndarray,
    ) -> np.ndarray:
        """(T,) free GPU cores on these rows that each shape could take."""
        return np.asarray(self._usable(agg, rows, fit_count, fit_free, cpu, mem).sum(axis=0, dtype=np.float64))

    def _reweigh(self, agg: _Aggregates) -> None:
        """Shape weights with the scarcity boosts; cached usable capacities go when the weights change (the
        boosts move in powers of two, so rarely)."""
        w = self._p
        if self.compiled:
            total = int(agg.free_total[0])
            w, changed = kernels.weights(w, agg.hosts, agg.room, total, self.scarce, self.pressure, self._w)
        else:
            if self.scarce:
                few = agg.hosts < self.scarce
                boost = np.exp2(np.ceil(np.log2(self.scarce / np.maximum(agg.hosts, 1))))
                w = (w * np.where(few, boost, 1.0)).astype(np.float32)
            if self.pressure:
                ratio = agg.free_total[0] / np.maximum(agg.room, 1.0)
                boost = np.exp2(np.round(np.log2(np.clip(ratio, 1.0, self.pressure))))
                w = (w * boost).astype(np.float32)
            changed = not np.array_equal(w, self._w)
        if changed:
            self._w = w
            self._generation += 1
            agg.usable = None
            agg.deltas.clear()

    def _after(self, agg: _Aggregates, rows: np.ndarray, gpus: int, cores: int, cpu_m: int, mem_m: int) -> np.ndarray:
        """Σ_t w_t · (free capacity usable by shape t) on these rows once a pod took `gpus` whole GPUs
        (`cores` of free capacity), `cpu_m` of CPU and `mem_m` of memory there."""
        if self.compiled:
            usable = kernels.node_matrix(
                rows, agg.fit_count, agg.fit_free, agg.cpu, agg.mem, self._k, self._cpu, self._mem, agg.access,
                gpus, cores, cpu_m, mem_m,
            )  # fmt: skip
        else:
            fit_count, fit_free = agg.fit_count[rows] - gpus, agg.fit_free[rows] - cores
            usable = self._usable(agg, rows, fit_count, fit_free, agg.cpu[rows] - cpu_m, agg.mem[rows] - mem_m)
        return np.asarray(usable @ self._w)

    def _usable(
        self,
        agg: _Aggregates,
        rows: np.ndarray | slice,
        fit_count: np.ndarray,
        fit_free: np.ndarray,
        cpu: np.ndarray,
        mem: np.ndarray,
    ) -> np.ndarray:
        """(rows, T) free GPU cores each shape could use on these rows: those of the GPUs with room for it
        where the whole shape fits, else none."""
        return np.asarray(self._ok(agg, rows, fit_count, cpu, mem) * fit_free)

    def _slot_deltas(self, pod: PodSpec, agg: _Aggregates, rows: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Change in fragmentation if a one-GPU pod takes GPU `slots[i]` of node `rows[i]`."""
        assert pod.gpu is not None and agg.usable is not None
        cores, cpu_m, mem_m = pod.gpu.cores, pod.cpu_m, self._mem_m(pod)
        if self.compiled:
            usable = kernels.slot_matrix(
                rows, slots, agg.free, agg.fit_count, agg.fit_free, agg.cpu, agg.mem, self._need, self._k,
                self._cpu, self._mem, agg.access, cores, cpu_m, mem_m,
            )  # fmt: skip
        else:
            f = agg.free[rows, slots]
            f_after = f - cores
            was = f[:, None] >= self._need
            now = f_after[:, None] >= self._need
            fit_count = agg.fit_count[rows] - was + now
            fit_free = agg.fit_free[rows] - was * f[:, None] + now * f_after[:, None]
            usable = self._usable(agg, rows, fit_count, fit_free, agg.cpu[rows] - cpu_m, agg.mem[rows] - mem_m)
        usable_before = agg.usable[rows]
        usable_after = usable @ self._w
        # fragmentation = free − usable; the pod itself takes `cores` of the free capacity
        return np.asarray(-pod.gpu.cores - usable_after + usable_before)

    def _node_deltas(self, pod: PodSpec, agg: _Aggregates, rows: np.ndarray) -> np.ndarray:
        """Change in fragmentation if a CPU-only or whole-GPU pod goes to each node of `rows`."""
        k = pod.gpu.count if pod.gpu is not None else 0
        taken = k * GPU_CORES  # whole GPUs: each fits every shape before, none after
        assert agg.usable is not None
        usable_before = agg.usable[rows]
        usable_after = self._after(agg, rows, k, taken, pod.cpu_m, self._mem_m(pod))
        return np.asarray(-taken - usable_after + usable_before + self._starved(pod, agg, rows))

    def _mem_m(self, pod: PodSpec) -> int:
        return pod.memory_mib if self.memory else 0

    def _starved(self, pod: PodSpec, agg: _Aggregates, rows: np.ndarray) -> np.ndarray:
        """Change in the price of the GPU capacity the node's free CPU could not feed (cpu_balance) once the pod
        took its GPU capacity and CPU, at the node's need and price as it is (`_cpu_need`): taking CPU never
        lowers the estimate."""
        if not self.cpu_balance:
            return np.zeros(len(rows))
        need, price = agg.need[rows], agg.price[rows]
        ok = need > 0  # else no shape can use the node (FGD's measure counts all of it lost already) or needs CPU
        taken = pod.gpu.count * pod.gpu.cores if pod.gpu is not None else 0
        free, cpu = agg.free[rows].sum(axis=1), agg.cpu[rows]
        before = np.maximum(0.0, free - np.divide(cpu, need, out=np.zeros(len(rows)), where=ok))
        after = np.maximum(0.0, free - taken - np.divide(cpu - pod.cpu_m, need, out=np.zeros(len(rows)), where=ok))
        return np.asarray(self.cpu_balance * price * np.where(ok, after - before, 0.0))

    def _cpu_need(self, agg: _Aggregates, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows,) the CPU per GPU percent the node's free GPUs need: that of the shapes that can use them (a
        model they allow, enough GPUs with room, enough memory; CPU is what is priced), by GPU demand, plus
        the CPU-only pods' share; and the price of a percent they cannot feed: what FGD's measure charges for
        a percent none of those shapes can use, the sum of their weights. Need 0 where no shape can use the
        node or none needs CPU."""
        if self.compiled:
            uses = kernels.uses(rows, agg.fit_count, agg.mem, agg.access, self._k, self._mem)
        else:
            uses = ((agg.fit_count[rows] >= self._k) & (agg.mem[rows][:, None] >= self._mem) & agg.access[rows]) * 1.0
        # sums of integers, so exact in any order
        cpu_of, gpu_of, price = uses @ self._need_cpu, uses @ self._need_gpu, uses @ self._w.astype(np.float64)
        need = np.divide(cpu_of, gpu_of, out=np.zeros(len(rows)), where=gpu_of > 0) + self._cpu_only_per_core
        return np.where(gpu_of > 0, need, 0.0), np.asarray(price)

    def _to_score(self, delta: np.ndarray) -> np.ndarray:
        # FGD's mapping: sigmoid of the decrease, in GPUs, scaled to 0..100: 100 / (1 + exp(clip(delta / 100,
        # -50, 50))), in place on one array (np.clip and a new array per step cost more than a few rows' math)
        x = np.divide(delta, GPU_CORES, dtype=np.float64)
        np.minimum(np.maximum(x, -50.0, out=x), 50.0, out=x)
        np.exp(x, out=x)
        x += 1.0
        np.divide(100.0, x, out=x)
        return np.asarray(np.floor(x, out=x)) if self.quantize else x

    # -- Score ----------------------------------------------------------------------------------------
    def generation(self, pod: PodSpec, view: EngineView) -> int:
        if self._keys:
            self._aggregates(view.state)
        return self._generation

    def score(self, pod: PodSpec, view: EngineView, mask: FitMask) -> np.ndarray:
        pod = pod.as_one_container()
        out = np.zeros(len(mask.nodes))
        if not self._keys:
            return out
        agg = self._aggregates(view.state)
        shared = pod.gpu is not None and not pod.gpu.exclusive
        key = _shape(pod, self.memory)  # a shared pod's GPUs are masked per call, so GPU memory is no part
        hit = agg.deltas.get(key)
        if hit is None:
            n = view.state.num_nodes
            rows, delta = np.arange(n), np.full((n, agg.free.shape[1]) if shared else n, np.inf)
            if len(agg.deltas) >= _CACHED_SHAPES:
                agg.deltas.clear()
        else:
            rows, delta = view.state.changes.since(hit[0]) if hit[0] != agg.at else _NO_ROWS, hit[1]
        if rows.size:
            delta[rows] = self._gpu_deltas(pod, agg, rows) if shared else self._node_deltas(pod, agg, rows)
        agg.deltas[key] = (agg.at, delta)
        fit = np.flatnonzero(mask.nodes)
        nodes = fit if isinstance(mask.rows, slice) else mask.rows[fit]
        # a shared pod's node scores by its best allowed GPU
        if shared:
            assert mask.slots is not None
            if self.compiled:
                best = kernels.best_gpu(delta, nodes, mask.slots[fit])
            else:
                best = np.where(mask.slots[fit], delta[nodes], np.inf).min(axis=1)
        else:
            best = delta[nodes]
        out[fit] = self._to_score(best)
        return out

    def _gpu_deltas(self, pod: PodSpec, agg: _Aggregates, rows: np.ndarray) -> np.ndarray:
        """(rows, G) change in fragmentation if a shared pod takes each GPU (inf where it has no room).
        GPUs of one node with equal free cores are equivalent: each such group is computed once."""
        assert pod.gpu is not None
        free = agg.free[rows]
        least = max(pod.gpu.cores, 1)
        if self.compiled:
            first, sub, slots = kernels.distinct_slots(free, least)
            deltas = self._slot_deltas(pod, agg, rows[sub], slots)
            return np.asarray(
                kernels.spread_slots(first, sub, slots, deltas, free, least, self._starved(pod, agg, rows))
            )
        room = free >= least
        same = free[:, :, None] == free[:, None, :]
        first = np.argmax(same, axis=1)  # (rows, G): the first GPU of the node with the same free cores
        sub, slots = np.nonzero(room & (first == np.arange(free.shape[1])))
        out = np.full(free.shape, np.inf)
        out[sub, slots] = self._slot_deltas(pod, agg, rows[sub], slots)
        out = np.take_along_axis(out, first, axis=1)
        return np.asarray(np.where(room, out, np.inf) + self._starved(pod, agg, rows)[:, None])

    def gpu_order(self, pod: PodSpec, view: EngineView, node: int, slots: np.ndarray) -> np.ndarray:
        if pod.gpu is None or pod.gpu.exclusive or not self._keys or len(slots) < 2:
            return slots
        agg = self._aggregates(view.state)
        delta = self._slot_deltas(pod, agg, np.full(len(slots), node), slots)
        # least increase first; among equals the fullest GPU, so whole GPUs stay free
        return slots[np.lexsort((agg.free[node, slots], delta))]
