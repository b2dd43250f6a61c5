"""Compiled twins of node-local plugins' common cases (numba, cached on disk): the `Resources` filter for a
GPU pod of one GPU container on a cluster without MIG cards (whole cards or shares), on the few rows that
changed since a pod shape's last evaluation, where the cost of the NumPy path is its dozen array operations,
not their size (on every node NumPy's whole-array passes are faster: at 5,000 nodes 60 against 130 µs); and
the free-fraction scores (`Binpack`, `Spread`, `LeastAllocated`) on any rows (on every node 24 against 68 µs).
The same integer comparisons as `Resources.filter` and `cardfit.card_ok`, so the same verdicts, and the
scores' float operations in their order, so the same floats (tests/test_evaluations.py compares each with its
NumPy path)."""

from __future__ import annotations

import numpy as np
from numba import njit

from fairgpu.model.node import GPU_CORES


@njit(cache=True)
def cards(
    rows: np.ndarray,
    schedulable: np.ndarray,
    cpu_free: np.ndarray,
    mem_free: np.ndarray,
    usable: np.ndarray,
    exclusive: np.ndarray,
    tasks: np.ndarray,
    split: np.ndarray,
    cores_free: np.ndarray,
    gpu_mem_free: np.ndarray,
    gpu_mem_cap: np.ndarray,
    whole: np.ndarray,
    cores_cap: np.ndarray,
    request: np.ndarray,
    nodes_at: np.ndarray,
    slots_at: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(nodes with the CPU, the memory and `count` such cards, (rows, G) cards that pass HAMi's per-card checks)
    for a shared-card request `request` = (cpu_m, memory_mib, cores, mem_mib, mem_pct, count); the verdicts
    also written at `rows` into (N,) `nodes_at` and (N, G) `slots_at` unless these are empty (`NOWHERE`)."""
    cpu_m, memory_mib, cores, mem_mib, mem_pct = request[0], request[1], request[2], request[3], request[4]
    n, gpus = rows.shape[0], usable.shape[1]
    nodes = np.empty(n, dtype=np.bool_)
    ok = np.empty((n, gpus), dtype=np.bool_)
    for i in range(n):
        r = rows[i]
        count = 0
        for g in range(gpus):
            fits = _open(usable[r, g], exclusive[r, g], tasks[r, g], split[r, g]) & _takes(
                cores_free[r, g], gpu_mem_free[r, g], gpu_mem_cap[r, g], whole[r, g], tasks[r, g], cores_cap[r, g],
                cores, mem_mib, mem_pct,
            )  # fmt: skip
            ok[i, g] = fits
            count += fits
        nodes[i] = schedulable[r] & (cpu_free[r] >= cpu_m) & (mem_free[r] >= memory_mib) & (count >= request[5])
    _write(rows, nodes, ok, nodes_at, slots_at)
    return nodes, ok


@njit(cache=True)
def _open(usable: bool, exclusive: bool, tasks: int, split: int) -> bool:
    """A card open to one more task (`cardfit.open_cards`): usable, not held alone, under its split count."""
    return usable & (not exclusive) & (tasks < split)


@njit(cache=True)
def _takes(
    cores_free: int, mem_free: int, mem_cap: int, whole: bool, tasks: int, cores_cap: int, cores: int, mem_mib: int,
    mem_pct: int,
) -> bool:  # fmt: skip
    """Whether a card open to one more task takes a share of `cores` and `mem_mib` (else `mem_pct` % of its
    memory): `cardfit.card_ok`'s checks past the open card. Branches only on the request (the same for every
    card): `&` and `|` where `and` and `or` would branch on each card's values (~35 against ~48 µs a pass over
    every node)."""
    need = mem_mib if mem_mib else mem_cap * mem_pct // 100
    fits = (cores_free >= cores) & (mem_free >= need)
    if cores >= GPU_CORES:  # a cores-100 task takes a 100-core card only to itself (node.exclusive_on)
        fits = fits & ((not whole) | (tasks == 0))
    if cores == 0:  # a task asking no cores needs a card with cores left, or one without any
        fits = fits & ((cores_free > 0) | (cores_cap == 0))
    return fits


@njit(cache=True)
def open_cards_take(
    schedulable: np.ndarray,
    cpu_free: np.ndarray,
    mem_free: np.ndarray,
    opened: np.ndarray,
    cores_free: np.ndarray,
    gpu_mem_free: np.ndarray,
    gpu_mem_cap: np.ndarray,
    whole: np.ndarray,
    tasks: np.ndarray,
    cores_cap: np.ndarray,
    request: np.ndarray,
    nodes: np.ndarray,
    ok: np.ndarray,
) -> None:
    """`cards` on every node, from every node's open cards (`cardfit.open_cards`, kept current by the caller),
    written into (N,) `nodes` and (N, G) `ok`: what a shared-card shape new to the engine asks. One pass reads
    a quarter of the memory NumPy's passes read and write (the open cards, free cores and memory, no
    temporaries): ~21 against ~29 µs at 5,000 nodes warm, 89 against 187 µs after the caches were flushed."""
    cpu_m, memory_mib, cores, mem_mib, mem_pct = request[0], request[1], request[2], request[3], request[4]
    n, gpus = opened.shape
    for r in range(n):
        count = 0
        for g in range(gpus):
            fits = opened[r, g] & _takes(
                cores_free[r, g], gpu_mem_free[r, g], gpu_mem_cap[r, g], whole[r, g], tasks[r, g], cores_cap[r, g],
                cores, mem_mib, mem_pct,
            )  # fmt: skip
            ok[r, g] = fits
            count += fits
        nodes[r] = schedulable[r] & (cpu_free[r] >= cpu_m) & (mem_free[r] >= memory_mib) & (count >= request[5])


@njit(cache=True)
def idle_cards(
    rows: np.ndarray,
    schedulable: np.ndarray,
    cpu_free: np.ndarray,
    mem_free: np.ndarray,
    idle: np.ndarray,
    gpu_mem_cap: np.ndarray,
    cpu_m: int,
    memory_mib: int,
    mem_mib: int,
    k: int,
    nodes_at: np.ndarray,
    slots_at: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(nodes with the CPU, the memory and `k` such cards, (rows, G) idle cards with `mem_mib` of memory if
    asked) for a pod that takes `k` whole cards; written at `rows` as `cards` writes."""
    n, gpus = rows.shape[0], idle.shape[1]
    nodes = np.empty(n, dtype=np.bool_)
    ok = np.empty((n, gpus), dtype=np.bool_)
    for i in range(n):
        r = rows[i]
        count = 0
        for g in range(gpus):
            fits = idle[r, g] & ((mem_mib == 0) | (gpu_mem_cap[r, g] >= mem_mib))
            ok[i, g] = fits
            count += fits
        nodes[i] = schedulable[r] & (cpu_free[r] >= cpu_m) & (mem_free[r] >= memory_mib) & (count >= k)
    _write(rows, nodes, ok, nodes_at, slots_at)
    return nodes, ok


# the card kernels' (N,) and (N, G) targets when the verdicts go nowhere else (empty: nothing is written there)
NOWHERE = (np.empty(0, dtype=np.bool_), np.empty((0, 0), dtype=np.bool_))


@njit(cache=True)
def _write(rows: np.ndarray, nodes: np.ndarray, ok: np.ndarray, nodes_at: np.ndarray, slots_at: np.ndarray) -> None:
    """The rows' verdicts into a pod shape's own arrays of every node (evaluations.Shape), where the engine
    keeps them: no array of the rows' verdicts to copy in afterwards."""
    if nodes_at.shape[0] == 0:
        return
    for i in range(rows.shape[0]):
        r = rows[i]
        nodes_at[r] = nodes[i]
        for g in range(ok.shape[1]):
            slots_at[r, g] = ok[i, g]


@njit(cache=True)
def free_fraction(
    rows: np.ndarray,
    free: tuple[np.ndarray, np.ndarray, np.ndarray],
    cap: tuple[np.ndarray, np.ndarray, np.ndarray],
    cpu_m: int,
    memory_mib: int,
    cores: int,
    order: np.ndarray,
    fuller: bool,
    base: np.ndarray,
    weight: float,
) -> np.ndarray:
    """(rows,) 100 × the mean over resources `order` (indices into `free`/`cap`: CPU, memory, GPU cores) of the
    fraction free once the pod took its `cpu_m`, `memory_mib` and `cores` (0 where a node has none of it),
    summed in that order as `scores._free_fraction` sums; `fuller`: 100 × (1 − that mean), Binpack's. With a
    non-empty float64 `base` of the rows, base + weight × those scores instead: NumPy's product then its sum, the
    same floats, without the scores' own array. One resource at a time over the rows: a tuple read by a
    resource index inside the row loop made it 5x slower than NumPy on every node, this way it is 3x faster."""
    n = rows.shape[0]
    taken = (cpu_m, memory_mib, cores)
    total = np.zeros(n, dtype=np.float64)
    for j in order:
        fj, cj, tj = free[j], cap[j], taken[j]
        for i in range(n):
            c = cj[rows[i]]
            total[i] += (fj[rows[i]] - tj) / c if c > 0 else 0.0
    for i in range(n):
        frac = total[i] / order.shape[0]
        total[i] = 100.0 * (1.0 - frac) if fuller else 100.0 * frac
    return plus_weighted(base, weight, total) if base.shape[0] else total


@njit(cache=True)
def plus_weighted(base: np.ndarray, weight: float, scores: np.ndarray) -> np.ndarray:
    """base + weight × scores in one pass and one new array: NumPy's product then its sum, the same floats."""
    out = np.empty(base.shape[0], dtype=np.float64)
    for i in range(base.shape[0]):
        out[i] = base[i] + weight * scores[i]
    return out


@njit(cache=True)
def open_cards(
    rows: np.ndarray, usable: np.ndarray, exclusive: np.ndarray, tasks: np.ndarray, split: np.ndarray
) -> np.ndarray:
    """(rows, G) `cardfit.open_cards` of these rows in one pass (every node's are kept, refreshed on the rows
    changed since: a few NumPy calls each on a handful of rows cost more than the pass)."""
    out = np.empty((rows.shape[0], usable.shape[1]), dtype=np.bool_)
    for i in range(rows.shape[0]):
        r = rows[i]
        for g in range(usable.shape[1]):
            out[i, g] = _open(usable[r, g], exclusive[r, g], tasks[r, g], split[r, g])
    return out
