"""Score plugin: Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation", USENIX ATC 2023).

A node's fragmentation for the workload mix is the expected GPU capacity (in percent of a GPU) that a pod
drawn from the mix could not use there: all of the node's free GPU capacity when the pod cannot fit at all
(too little CPU, too few GPUs with room, no allowed model), else the free capacity of the GPUs too full to
take it. A pod goes where it increases this the least, and on that node to the GPU that does.

The mix is learned online from the pods placed for real so far (no look at pods not yet seen, nor at dry
runs), each pod counted once however often it is tried (`learn`; the mix: fragmentation_mix.py). Per node
and shape the plugin keeps how many GPUs could take the shape and how much free capacity they hold
(fragmentation_nodes.py), and per pod shape the change each node would see; both are brought up to date only
for nodes whose state changed since (ClusterState.changes), so after one placement a score recomputes one
node. `cpu_balance`'s CPU-side measure is in fragmentation_cpu.py, the compiled loops in
fragmentation_kernels.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fairgpu.framework.interfaces import EngineView, FitMask
from fairgpu.model.node import GPU_CORES
from fairgpu.model.pod import PodSpec
from fairgpu.plugins import blas
from fairgpu.plugins import fragmentation_kernels as kernels
from fairgpu.plugins import fragmentation_nodes as per_node
from fairgpu.plugins.fragmentation_cpu import need_and_price, starved
from fairgpu.plugins.fragmentation_mix import ShapeMix, shape_key
from fairgpu.plugins.kernel_warmup import exercise, once
from fairgpu.state import ClusterState

_CACHED_SHAPES = 512
_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_CAPACITY = np.zeros(0, dtype=np.float32)
_NO_FLOATS = np.zeros(0)
_SETTINGS = ("quantize", "by_demand", "cpu_balance", "scarce", "pressure", "memory", "max_shapes", "compiled")


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
    # beside 4 GPUs that only light shapes can use are priced at those shapes' need, not at the mix's. With
    # `memory`, memory too, shape by shape (fragmentation_cpu.memory_short): the capacity of a shape's GPUs
    # that the node's memory cannot feed at the shape's own memory per GPU.
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
    # the inner loops compiled (fragmentation_kernels.py); False runs the NumPy path, bit for bit the same (and
    # so does a NumPy without the BLAS the kernels call for its products: plugins/blas.py)
    compiled: bool = True
    _mix: ShapeMix = field(default_factory=ShapeMix)
    _w: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))  # the mix's p with boosts
    _w64: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _agg: per_node.Aggregates | None = None
    # bumped whenever cached deltas go stale wholesale (new weights, new aggregates): the engine then
    # rescores every node, else only nodes whose state changed
    _generation: int = 0
    # the shapes whose weights moved by a boost since the prices were current (None: recompute them all)
    _moved: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.max_shapes < 1:
            raise ValueError("max_shapes must be at least 1")
        self.compiled = self.compiled and blas.AVAILABLE
        if self.compiled:  # once per process and settings; a fresh plugin: this one learns nothing from it
            settings = {name: getattr(self, name) for name in _SETTINGS}
            once(("Fragmentation", *settings.values()), lambda: exercise(Fragmentation(**settings)))

    # -- the workload mix ---------------------------------------------------------------------------
    def learn(self, key: str, pod: PodSpec) -> None:
        """Count the pod into the mix once, however often it is tried: the mix is the shapes that arrive,
        and a pod retried every cycle or with every gang attempt is one arrival, not one per try. A pod
        deleted before it was placed stays counted, like one that ran and finished: it arrived, and what
        arrives is what the measure keeps room for (taking it out would drop exactly the shapes the cluster
        fails to serve)."""
        if self._mix.first_time(key):
            self._learn(pod.as_one_container())  # a pod of several GPU containers by its whole request

    def _learn(self, pod: PodSpec) -> None:
        added, refreshed = self._mix.add(pod, self.memory, self.by_demand, self.max_shapes, self._agg is None)
        self._generation += added + refreshed
        if refreshed and self._agg is not None:
            self._agg.stale()

    # -- per-node aggregates ------------------------------------------------------------------------
    def _aggregates(self, state: ClusterState) -> per_node.Aggregates:
        agg, mix = self._agg, self._mix
        if agg is not None and agg.state is state and agg.at == state.version and agg.usable is not None:
            return agg  # nothing changed since, weights included (new weights drop `usable`)
        mem = state.mem_free if self.memory else np.zeros_like(state.mem_free)
        if agg is None or agg.state is not state:
            agg = self._agg = per_node.build(state, mix, mem)
            self._generation += 1
        elif agg.shapes < len(mix.need):
            per_node.extend(agg, mix, self.compiled, self.max_shapes)
        rows = state.changes.since(agg.at) if agg.at != state.version else _NO_ROWS
        if rows.size and self.compiled:  # refresh, weights, the rows' usable capacity, need and price in one call
            balance = self.cpu_balance and agg.usable is not None
            w, changed = kernels.upkeep(
                rows, state.gpu_usable, state.gpu_cores_free, state.cpu_free, mem, mix.need, mix.k, mix.cpu, mix.mem,
                agg.wide_access, agg.free, agg.cpu, agg.mem, agg.wide_count, agg.wide_free, agg.hosts, agg.room,
                agg.free_total, mix.p, self.scarce, self.pressure, self._w, mix.need_cpu, mix.need_gpu,
                mix.cpu_only_per_core, agg.need if balance else _NO_FLOATS, agg.price if balance else _NO_FLOATS,
                _NO_CAPACITY if agg.usable is None else agg.usable,
            )  # fmt: skip
            if changed:
                self._new_weights(agg, w)
        else:
            if rows.size:
                per_node.refresh(agg, mix, rows, mem)
            if rows.size or agg.usable is None:  # the boosts follow `hosts` and `room`, which only refreshed rows move
                self._reweigh(agg)
            if agg.usable is not None and rows.size:
                agg.usable[rows] = self._after(agg, rows, 0, 0, 0, 0)
            if agg.usable is not None and rows.size and self.cpu_balance:
                agg.need[rows], agg.price[rows] = need_and_price(agg, mix, self._w, rows, self.compiled)
        if agg.usable is None:
            every = np.arange(state.num_nodes)
            agg.usable = self._after(agg, every, 0, 0, 0, 0)
            if not self.cpu_balance:
                agg.need, agg.price = every * 0.0, every * 0.0
            elif self._moved is None:
                agg.need, agg.price = need_and_price(agg, mix, self._w, every, self.compiled)
            else:  # a boost moved some weights: the rows refreshed now, and those where a moved shape counts
                stale = np.union1d(rows, self._counting(agg, self._moved))
                agg.need[stale], agg.price[stale] = need_and_price(agg, mix, self._w, stale, self.compiled)
            self._moved = None
        agg.at = state.version
        return agg

    def _reweigh(self, agg: per_node.Aggregates) -> None:
        """Shape weights with the scarcity boosts; cached usable capacities go when the weights change (the
        boosts move in powers of two, so rarely)."""
        w = self._mix.p
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
            self._new_weights(agg, w)

    def _new_weights(self, agg: per_node.Aggregates, w: np.ndarray) -> None:
        """Cached usable capacities and deltas go stale with the weights; so do the prices, but where only some
        weights moved (a boost, not a new mix) and the prices were current, only where those shapes count."""
        current = agg.usable is not None and w.shape == self._w.shape
        self._moved = np.flatnonzero(w != self._w) if current else None
        self._w, self._w64 = w, w.astype(np.float64)  # a shared pod's products are float64, as NumPy promotes
        self._generation += 1
        agg.stale()

    def _counting(self, agg: per_node.Aggregates, shapes: np.ndarray) -> np.ndarray:
        """The nodes where any of these shapes counts in `need_and_price` (a model it allows, enough GPUs with
        room, enough memory). Elsewhere a price, the float64 product of the shapes counting with the weights,
        adds the same terms in the same order (0 for these), so it keeps its bits when only their weights move
        (the need does not depend on the weights at all)."""
        mix = self._mix
        counts = (agg.fit_count[:, shapes] >= mix.k[shapes]) & (agg.mem[:, None] >= mix.mem[shapes])
        return np.flatnonzero((counts & agg.access[:, shapes]).any(axis=1))

    def _after(
        self, agg: per_node.Aggregates, rows: np.ndarray, gpus: int, cores: int, cpu_m: int, mem_m: int
    ) -> np.ndarray:
        """Σ_t w_t · (free capacity usable by shape t) on these rows once a pod took `gpus` whole GPUs
        (`cores` of free capacity), `cpu_m` of CPU and `mem_m` of memory there."""
        mix = self._mix
        if self.compiled:
            usable = kernels.node_matrix(
                rows, agg.wide_count, agg.wide_free, agg.cpu, agg.mem, mix.k, mix.cpu, mix.mem, agg.wide_access,
                gpus, cores, cpu_m, mem_m,
            )  # fmt: skip
        else:
            fit_count, fit_free = agg.fit_count[rows] - gpus, agg.fit_free[rows] - cores
            usable = per_node.usable(
                agg, self._mix, rows, fit_count, fit_free, agg.cpu[rows] - cpu_m, agg.mem[rows] - mem_m
            )
        return np.asarray(usable @ self._w)

    def _slot_deltas(self, pod: PodSpec, agg: per_node.Aggregates, rows: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Change in fragmentation if a one-GPU pod takes GPU `slots[i]` of node `rows[i]` (the NumPy path; the
        compiled one is in `kernels.gpu_scores` and `kernels.gpu_order`)."""
        assert pod.gpu is not None and agg.usable is not None
        cores, cpu_m, mem_m = pod.gpu.cores, pod.cpu_m, self._mem_m(pod)
        f = agg.free[rows, slots]
        f_after = f - cores
        was = f[:, None] >= self._mix.need
        now = f_after[:, None] >= self._mix.need
        fit_count = agg.fit_count[rows] - was + now
        fit_free = agg.fit_free[rows] - was * f[:, None] + now * f_after[:, None]
        usable = per_node.usable(
            agg, self._mix, rows, fit_count, fit_free, agg.cpu[rows] - cpu_m, agg.mem[rows] - mem_m
        )
        usable_before = agg.usable[rows]
        usable_after = usable @ self._w
        # fragmentation = free − usable; the pod itself takes `cores` of the free capacity
        return np.asarray(-pod.gpu.cores - usable_after + usable_before)

    def _node_deltas(self, pod: PodSpec, agg: per_node.Aggregates, rows: np.ndarray) -> np.ndarray:
        """Change in fragmentation if a CPU-only or whole-GPU pod goes to each node of `rows`."""
        k = pod.gpu.count if pod.gpu is not None else 0
        taken = k * GPU_CORES  # whole GPUs: each fits every shape before, none after
        assert agg.usable is not None
        usable_before = agg.usable[rows]
        usable_after = self._after(agg, rows, k, taken, pod.cpu_m, self._mem_m(pod))
        return np.asarray(-taken - usable_after + usable_before + self._starved(pod, agg, rows))

    def _mem_m(self, pod: PodSpec) -> int:
        return pod.memory_mib if self.memory else 0

    def _starved(self, pod: PodSpec, agg: per_node.Aggregates, rows: np.ndarray) -> np.ndarray:
        """cpu_balance's change once the pod took its GPU capacity, CPU and (with `memory`) memory on each of
        these nodes."""
        if not self.cpu_balance:
            return np.zeros(len(rows))
        taken = pod.gpu.count * pod.gpu.cores if pod.gpu is not None else 0
        return starved(agg, self._mix, self._w, rows, taken, pod.cpu_m, self._mem_m(pod), self.cpu_balance)

    @staticmethod
    def _exponent(delta: np.ndarray) -> np.ndarray:
        """FGD's mapping, first part: the decrease in GPUs, clipped to ±50."""
        x = np.divide(delta, GPU_CORES, dtype=np.float64)
        return np.asarray(np.minimum(np.maximum(x, -50.0, out=x), 50.0, out=x))

    def _to_score(self, x: np.ndarray) -> np.ndarray:
        # FGD's mapping: sigmoid of the decrease, in GPUs, scaled to 0..100: 100 / (1 + exp(clip(delta / 100,
        # -50, 50))), in place on the clipped exponents (`_exponent`; np.clip and a new array per step cost
        # more than a few rows' math; numba's exp rounds otherwise than NumPy's, so the compiled path calls
        # NumPy's own loop: `kernels.exp_in_place`)
        np.exp(x, out=x)
        x += 1.0
        np.divide(100.0, x, out=x)
        return np.asarray(np.floor(x, out=x)) if self.quantize else x

    # -- Score ----------------------------------------------------------------------------------------
    def generation(self, pod: PodSpec, view: EngineView) -> int:
        if self._mix.keys:
            self._aggregates(view.state)
        return self._generation

    def score(self, pod: PodSpec, view: EngineView, mask: FitMask) -> np.ndarray:
        pod = pod.as_one_container()
        if not self._mix.keys:
            return np.zeros(len(mask.nodes))
        state = view.state
        agg = self._aggregates(state)
        # whole cards are idle cards, priced per node; any other GPU pod per card (on cards of 200 cores a
        # cores-100 pod takes half of one, HAMi's share, and leaves the rest to the mix)
        shared = pod.gpu is not None and not state.takes_whole_cards(pod.gpu)
        key = shape_key(pod, self.memory)  # a shared pod's GPUs are masked per call, so GPU memory is no part
        entry = agg.deltas.get(key)
        if entry is None:
            n = state.num_nodes
            spare = agg.spare[shared]
            if spare:
                entry = spare.pop()
                entry.valid.fill(False)
            else:
                entry = per_node.Deltas.empty(agg.at, n, agg.free.shape[1], shared)
            changed = _NO_ROWS if shared else np.arange(n)
            if len(agg.deltas) >= _CACHED_SHAPES:
                agg.deltas.clear()
            agg.deltas[key] = entry
        else:
            changed = state.changes.since(entry.at) if entry.at != agg.at else _NO_ROWS
        entry.at = agg.at
        delta, valid = entry.delta, entry.valid
        # A shared pod's changes are brought up to date only on the nodes asked about (a node's change depends
        # on that node alone, and its float64 product rounds alike in any batch of rows); the rest wait until
        # a pod of the shape can go there: after new weights or for a new shape, the nodes that fit, not every
        # node. A whole-GPU pod's float32 product rounds by the rows batched with it, so its rows go in the
        # batches they always did: every node, then the nodes changed since.
        if self.compiled:  # all of it in one call
            return self._compiled_scores(pod, agg, mask, shared, changed, entry)
        fit = mask.nodes.nonzero()[0]  # np.flatnonzero costs a microsecond more per call
        nodes = fit if isinstance(mask.rows, slice) else mask.rows[fit]
        if shared:
            valid[changed] = False
            rows = nodes[~valid[nodes]]
        else:
            rows = changed
        if rows.size:
            valid[rows] = True
            delta[rows] = self._gpu_deltas(pod, agg, rows) if shared else self._node_deltas(pod, agg, rows)
        # a shared pod's node scores by its best allowed GPU
        if shared:
            assert mask.slots is not None
            x = self._exponent(np.where(mask.slots[fit], delta[nodes], np.inf).min(axis=1))
        else:
            x = self._exponent(delta[nodes])
        out = np.zeros(len(mask.nodes))
        out[fit] = self._to_score(x)
        return out

    def _compiled_scores(
        self,
        pod: PodSpec,
        agg: per_node.Aggregates,
        mask: FitMask,
        shared: bool,
        changed: np.ndarray,
        entry: per_node.Deltas,
    ) -> np.ndarray:
        """The scores by the compiled kernels: the shape's cached rows brought up to date (a matrix of each
        shape's usable capacity after the pod, its product with the weights, and the rest around them: the
        values of `_gpu_deltas` and `_node_deltas`, which the NumPy path runs), then FGD's mapping on the
        nodes that fit, NumPy's exp included."""
        mix, cpu_m, mem_m = self._mix, pod.cpu_m, self._mem_m(pod)
        assert agg.usable is not None
        whole = isinstance(mask.rows, slice)
        rows = mask.rows if not isinstance(mask.rows, slice) else _NO_ROWS
        k = pod.gpu.count if pod.gpu is not None else 0
        pct = k * pod.gpu.cores if pod.gpu is not None else 0  # the starved term's GPU percent taken
        weight = float(self.cpu_balance)  # one compiled signature whatever type the profile gave
        if shared:
            assert pod.gpu is not None and mask.slots is not None
            out = kernels.gpu_scores(
                mask.nodes, rows, whole, mask.slots, changed, entry.valid, entry.least, entry.first, agg.free,
                agg.wide_count, agg.wide_free, agg.cpu, agg.mem, mix.need, mix.k, mix.cpu, mix.mem, agg.wide_access,
                pod.gpu.cores, cpu_m, mem_m, self._w64, self._w, agg.usable, agg.need, agg.price, pct, weight,
                mix.gpu_per_mib, entry.delta, self.quantize, blas.EXP_CALL,
            )  # fmt: skip
        else:
            out = kernels.node_scores(
                mask.nodes, rows, whole, changed, agg.free, agg.wide_count, agg.wide_free, agg.cpu, agg.mem, mix.k,
                mix.cpu, mix.mem, agg.wide_access, k, k * GPU_CORES, cpu_m, mem_m, self._w, agg.usable, agg.need,
                agg.price, pct, weight, mix.gpu_per_mib, entry.delta, self.quantize, blas.EXP_CALL,
            )  # fmt: skip
        return np.asarray(out)

    def _gpu_deltas(self, pod: PodSpec, agg: per_node.Aggregates, rows: np.ndarray) -> np.ndarray:
        """(rows, G) change in fragmentation if a shared pod takes each GPU (inf where it has no room).
        GPUs of one node with equal free cores are equivalent: each such group is computed once. The NumPy
        path; the compiled one is `_compiled_scores`."""
        assert pod.gpu is not None
        free = agg.free[rows]
        # a task asking no cores has room on a card with no cores to share (the filter keeps it off a full one)
        least = pod.gpu.cores
        room = free >= least
        same = free[:, :, None] == free[:, None, :]
        first = np.argmax(same, axis=1)  # (rows, G): the first GPU of the node with the same free cores
        sub, slots = np.nonzero(room & (first == np.arange(free.shape[1])))
        out = np.full(free.shape, np.inf)
        out[sub, slots] = self._slot_deltas(pod, agg, rows[sub], slots)
        out = np.take_along_axis(out, first, axis=1)
        return np.asarray(np.where(room, out, np.inf) + self._starved(pod, agg, rows)[:, None])

    def gpu_order(self, pod: PodSpec, view: EngineView, node: int, slots: np.ndarray) -> np.ndarray | None:
        if not self._mix.keys:
            return None  # nothing learned: no opinion, as on the nodes; the next plugin orders the cards
        if pod.gpu is None or view.state.takes_whole_cards(pod.gpu) or len(slots) < 2:
            return slots  # whole cards: idle cards of 100 cores, all alike
        agg = self._aggregates(view.state)
        if self.compiled:
            mix = self._mix
            assert agg.usable is not None
            order = kernels.gpu_order(
                node, slots, agg.free, agg.wide_count, agg.wide_free, agg.cpu, agg.mem, mix.need, mix.k, mix.cpu,
                mix.mem, agg.wide_access, pod.gpu.cores, pod.cpu_m, self._mem_m(pod), self._w64, agg.usable,
            )  # fmt: skip
            return np.asarray(order)
        delta = self._slot_deltas(pod, agg, np.full(len(slots), node), slots)
        # least increase first; among equals the fullest GPU, so whole GPUs stay free
        return slots[np.lexsort((agg.free[node, slots], delta))]
