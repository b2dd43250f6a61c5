"""Per-node sums `Fragmentation` keeps for every learned shape (how many GPUs could take it, how much free
capacity they hold, whether the node has a model it allows) and, cluster-wide, on how many nodes and over how
much capacity each shape fits: built once per cluster state, then brought up to date only for the nodes
whose state changed since (ClusterState.changes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fairgpu.plugins import fragmentation_kernels as kernels
from fairgpu.plugins.fragmentation_mix import ShapeMix
from fairgpu.state import ClusterState


@dataclass(slots=True)
class Deltas:
    """One pod shape's change in fragmentation on each node, brought up to date only on the nodes changed since
    `at`, and only once a pod of the shape can go there."""

    at: int  # the state's version when last brought up to date
    delta: np.ndarray  # (N,), or (N, G) per GPU for a shared shape (inf where the GPU has no room)
    valid: np.ndarray  # (N,) bool: the nodes whose changes are computed and current
    # a shared shape's (N,) least change over each node's GPUs and (N,) the first GPU with it (compiled path;
    # else empty): a pod whose mask allows that GPU scores the node by it without reading the node's row
    least: np.ndarray
    first: np.ndarray

    @staticmethod
    def empty(at: int, nodes: int, gpus: int, shared: bool) -> Deltas:
        none = np.zeros(0)
        delta = np.full((nodes, gpus) if shared else nodes, np.inf)
        least, first = (np.full(nodes, np.inf), np.zeros(nodes, dtype=np.int64)) if shared else (none, none)
        return Deltas(at, delta, np.zeros(nodes, dtype=bool), least, first)


@dataclass(slots=True)
class Aggregates:
    """Per-node sums for every known shape, valid for `free`/`cpu` as they were when computed."""

    state: ClusterState
    free: np.ndarray  # (N, G) free cores of usable GPUs, 0 elsewhere
    cpu: np.ndarray  # (N,)
    mem: np.ndarray  # (N,) free memory (MiB), or zeros when the measure leaves memory out
    # (N, W) per shape, in the first T columns (W >= T, the rest zeros: a new shape's column is written in
    # place, not the whole table copied and its fresh pages faulted in, ~0.8 ms at 5,000 nodes): the GPUs with
    # room for it (int16: a quarter of int64's memory traffic in the passes over every node after new
    # weights), their free cores (float32: half the memory traffic) and whether the node has a GPU of a model
    # it allows. The kernels take these whole (C-contiguous: a view of T columns would be a strided array,
    # several times slower there) and read the first len(k) columns; `fit_count`, `fit_free` and `access`
    # are the (N, T) views
    wide_count: np.ndarray
    wide_free: np.ndarray
    wide_access: np.ndarray
    shapes: int  # T
    hosts: np.ndarray  # (T,) nodes where each shape fits now
    room: np.ndarray  # (T,) free GPU cores, cluster-wide, on nodes where each shape fits now
    free_total: np.ndarray  # (1,) free cores of usable GPUs, cluster-wide
    at: int  # the state's version when last brought up to date
    usable: np.ndarray | None = None  # (N,) expected usable free capacity under the current weights
    # (N,) cpu_balance's CPU per GPU percent that each node's free GPUs need, and the price of one starved
    # percent there, valid with `usable`
    need: np.ndarray = field(default_factory=lambda: np.zeros(0))
    price: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # per pod key: pod shapes repeat, and between two placements only the nodes that changed need scoring again
    deltas: dict[tuple[Any, ...], Deltas] = field(default_factory=dict)
    # shapes dropped with stale weights, (N,) then (N, G): a shape's next pod takes one's arrays instead of fresh
    # ones (a 5,000-node (N, G) array's fresh pages: ~45 µs). Never more than `deltas` held at once
    spare: tuple[list[Deltas], list[Deltas]] = field(default_factory=lambda: ([], []))

    def stale(self) -> None:
        """New weights: the usable capacities and every shape's deltas go (their arrays kept as `spare`)."""
        self.usable = None
        for entry in self.deltas.values():
            self.spare[entry.delta.ndim - 1].append(entry)
        self.deltas.clear()

    @property
    def fit_count(self) -> np.ndarray:
        return self.wide_count[:, : self.shapes]

    @property
    def fit_free(self) -> np.ndarray:
        return self.wide_free[:, : self.shapes]

    @property
    def access(self) -> np.ndarray:
        return self.wide_access[:, : self.shapes]


def free_cores(state: ClusterState, rows: np.ndarray | slice) -> np.ndarray:
    return np.where(state.gpu_usable[rows], state.gpu_cores_free[rows], 0).astype(np.int64)


def build(state: ClusterState, mix: ShapeMix, mem: np.ndarray) -> Aggregates:
    """The aggregates of every node from the state as it is (`mem`: its free memory, or zeros)."""
    free = free_cores(state, slice(None))
    fit = free[:, :, None] >= mix.need
    access = (
        np.stack([state.model_slots(p.allows_model).any(axis=1) for p in mix.pods], axis=1)
        if mix.pods
        else np.zeros((state.num_nodes, 0), dtype=bool)
    )
    fit_free = (fit * free[:, :, None]).sum(axis=1).astype(np.float32)
    none, total = np.zeros(0), np.array([free.sum()])
    cpu = state.cpu_free
    agg = Aggregates(
        state,
        free,
        cpu.copy(),
        mem.copy(),
        fit.sum(axis=1, dtype=np.int16),
        fit_free,
        access,
        len(mix.pods),
        none,
        none,
        total,
        state.version,
    )
    agg.hosts = shapes_fit(agg, mix, slice(None), agg.fit_count, agg.cpu, agg.mem).sum(axis=0)
    agg.room = room(agg, mix, slice(None), agg.fit_count, agg.fit_free, agg.cpu, agg.mem)
    return agg


def extend(agg: Aggregates, mix: ShapeMix, compiled: bool, most: int) -> None:
    """Columns for the shapes learned since the aggregates were built, from the node state they reflect
    (the same sums a fresh build makes, column by column; the rows refreshed next then cover them too), in
    place: the tables grow by doubling, to `most` columns (the plugin's max_shapes). `compiled`: the columns
    in one pass (`fragmentation_kernels.extend`), the same values."""
    old, shapes = agg.shapes, len(mix.need)
    if shapes > agg.wide_count.shape[1]:
        width = max(shapes, min(2 * agg.wide_count.shape[1], most))
        for name in ("wide_count", "wide_free", "wide_access"):
            table = getattr(agg, name)
            grown = np.zeros((table.shape[0], width), dtype=table.dtype)
            grown[:, :old] = table[:, :old]
            setattr(agg, name, grown)
    agg.shapes = shapes
    new = slice(old, shapes)
    if compiled:
        state = agg.state  # the models each new shape allows (`model_slots`' test), by model id
        allowed = np.array([[p.allows_model(m) for m in state.models] for p in mix.pods[new]], dtype=bool)
        hosts, room = kernels.extend(
            agg.free, agg.cpu, agg.mem, mix.need, mix.k, mix.cpu, mix.mem, allowed,
            state.gpu_model, state.gpu_valid, old, agg.wide_count, agg.wide_free, agg.wide_access,
        )  # fmt: skip
    else:
        free = agg.free[:, :, None]
        fit = free >= mix.need[new]
        fit_count, fit_free = fit.sum(axis=1), (fit * free).sum(axis=1).astype(np.float32)
        access = np.stack([agg.state.model_slots(p.allows_model).any(axis=1) for p in mix.pods[new]], axis=1)
        ok = (fit_count >= mix.k[new]) & (agg.cpu[:, None] >= mix.cpu[new]) & (agg.mem[:, None] >= mix.mem[new])
        ok &= access
        agg.fit_count[:, new], agg.fit_free[:, new], agg.access[:, new] = fit_count, fit_free, access
        hosts, room = ok.sum(axis=0), (ok * fit_free).sum(axis=0, dtype=np.float64)
    agg.hosts = np.concatenate([agg.hosts, hosts])
    agg.room = np.concatenate([agg.room, room])


def refresh(agg: Aggregates, mix: ShapeMix, rows: np.ndarray, mem: np.ndarray) -> None:
    """These rows' aggregates from the state's free cores, CPU and memory (`mem`: all nodes' free memory, or
    zeros), and `hosts`, `room` and `free_total` moved with them. The NumPy path; the compiled one is
    `fragmentation_kernels.refresh_rows`, inside the plugin's one upkeep call."""
    state = agg.state
    free, cpu, mem = free_cores(state, rows), state.cpu_free[rows], mem[rows]
    fit = free[:, :, None] >= mix.need
    agg.hosts -= shapes_fit(agg, mix, rows, agg.fit_count[rows], agg.cpu[rows], agg.mem[rows]).sum(axis=0)
    agg.room -= room(agg, mix, rows, agg.fit_count[rows], agg.fit_free[rows], agg.cpu[rows], agg.mem[rows])
    agg.fit_count[rows] = fit.sum(axis=1)
    agg.fit_free[rows] = (fit * free[:, :, None]).sum(axis=1)
    agg.free_total += free.sum() - agg.free[rows].sum()
    agg.free[rows], agg.cpu[rows], agg.mem[rows] = free, cpu, mem
    agg.hosts += shapes_fit(agg, mix, rows, agg.fit_count[rows], agg.cpu[rows], agg.mem[rows]).sum(axis=0)
    agg.room += room(agg, mix, rows, agg.fit_count[rows], agg.fit_free[rows], agg.cpu[rows], agg.mem[rows])


def shapes_fit(
    agg: Aggregates, mix: ShapeMix, rows: np.ndarray | slice, fit_count: np.ndarray, cpu: np.ndarray, mem: np.ndarray
) -> np.ndarray:
    """(rows, T): each shape fits on the node."""
    return np.asarray((fit_count >= mix.k) & (cpu[:, None] >= mix.cpu) & (mem[:, None] >= mix.mem) & agg.access[rows])


def usable(
    agg: Aggregates,
    mix: ShapeMix,
    rows: np.ndarray | slice,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
) -> np.ndarray:
    """(rows, T) free GPU cores each shape could use on these rows: those of the GPUs with room for it
    where the whole shape fits, else none."""
    return np.asarray(shapes_fit(agg, mix, rows, fit_count, cpu, mem) * fit_free)


def room(
    agg: Aggregates,
    mix: ShapeMix,
    rows: np.ndarray | slice,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
) -> np.ndarray:
    """(T,) free GPU cores on these rows that each shape could take."""
    return np.asarray(usable(agg, mix, rows, fit_count, fit_free, cpu, mem).sum(axis=0, dtype=np.float64))
