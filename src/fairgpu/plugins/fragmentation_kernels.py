"""Compiled inner loops of `Fragmentation` (numba, cached on disk so a cold start compiles once).

Each kernel does in one pass what the plugin's NumPy path does in a dozen array operations on a few rows,
where the cost is the operations' count, not their size. They compute the same values in the same
floating-point types and order, so results are bit-identical to the NumPy path
(tests/test_evaluations.py); the weighted sums over shapes are NumPy's own matrix-vector products, the
same BLAS routines called the same way (blas.py), so a change of shape weights changes nothing here.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from fairgpu.plugins import blas

_ALIKE_FROM = 16  # rows from which `alike` groups them: a few rows cost less computed than hashed


@njit(cache=True)
def refresh_rows(
    rows: np.ndarray,
    usable: np.ndarray,
    cores_free: np.ndarray,
    cpu_free: np.ndarray,
    mem_free: np.ndarray,
    need: np.ndarray,
    k: np.ndarray,
    cpu_t: np.ndarray,
    mem_t: np.ndarray,
    access: np.ndarray,
    free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    hosts: np.ndarray,
    room: np.ndarray,
    free_total: np.ndarray,
) -> None:
    """Bring the aggregates of `rows` up to the state's (free cores of usable GPUs, CPU, memory, per shape the
    GPUs with room and their free cores) and move `hosts`, the nodes each shape fits on, `room`, the free
    cores each shape could take, and `free_total[0]`, all free cores, with them (`room` sums integers in
    float64: exact in any order)."""
    gpus, shapes = free.shape[1], need.shape[0]
    for i in range(rows.shape[0]):
        r = rows[i]
        for t in range(shapes):
            if fit_count[r, t] >= k[t] and cpu[r] >= cpu_t[t] and mem[r] >= mem_t[t] and access[r, t]:
                hosts[t] -= 1
                room[t] -= np.float64(fit_free[r, t])
        cpu[r] = cpu_free[r]
        mem[r] = mem_free[r]
        for g in range(gpus):
            free_total[0] -= free[r, g]
            free[r, g] = cores_free[r, g] if usable[r, g] else 0
            free_total[0] += free[r, g]
        for t in range(shapes):
            n = 0
            s = 0
            for g in range(gpus):
                if free[r, g] >= need[t]:
                    n += 1
                    s += free[r, g]
            fit_count[r, t] = n
            fit_free[r, t] = s
            if n >= k[t] and cpu[r] >= cpu_t[t] and mem[r] >= mem_t[t] and access[r, t]:
                hosts[t] += 1
                room[t] += np.float64(fit_free[r, t])


@njit(cache=True)
def extend(
    free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    need: np.ndarray,
    k: np.ndarray,
    cpu_t: np.ndarray,
    mem_t: np.ndarray,
    allowed: np.ndarray,
    gpu_model: np.ndarray,
    gpu_valid: np.ndarray,
    old: int,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    access: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """`fragmentation_nodes.extend`'s columns `old`..len(need) of fit_count, fit_free and access, written in
    place in one pass over the nodes (`allowed[j, m]`: shape old + j allows the state's model m; a node has
    access where a real GPU slot holds one, as `ClusterState.model_slots` says), and the new shapes' hosts and
    room: counts and integer sums, `room` integers summed in float64 (exact in any
    order), so the NumPy path's values."""
    n, gpus = free.shape
    shapes = need.shape[0]
    hosts = np.zeros(shapes - old, dtype=np.int64)
    room = np.zeros(shapes - old, dtype=np.float64)
    for r in range(n):
        for t in range(old, shapes):
            c = 0
            s = 0
            a = False
            for g in range(gpus):
                if free[r, g] >= need[t]:
                    c += 1
                    s += free[r, g]
                m = gpu_model[r, g]
                a = a or (gpu_valid[r, g] and m >= 0 and allowed[t - old, m])
            fit_count[r, t] = c
            fit_free[r, t] = s
            access[r, t] = a
            if c >= k[t] and cpu[r] >= cpu_t[t] and mem[r] >= mem_t[t] and a:
                hosts[t - old] += 1
                room[t - old] += np.float64(fit_free[r, t])
    return hosts, room


@njit(cache=True)
def node_matrix(
    rows: np.ndarray,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    k: np.ndarray,
    cpu_t: np.ndarray,
    mem_t: np.ndarray,
    access: np.ndarray,
    gpus: int,
    cores: int,
    cpu_m: int,
    mem_m: int,
) -> np.ndarray:
    """(rows, T) float32: free cores usable by each shape on each node once a pod took `gpus` whole GPUs
    (`cores` of free capacity), `cpu_m` of CPU and `mem_m` of memory; zero where the shape no longer fits."""
    shapes = k.shape[0]
    out = np.empty((rows.shape[0], shapes), dtype=np.float32)
    taken = np.float32(cores)
    for i in range(rows.shape[0]):
        r = rows[i]
        c = cpu[r] - cpu_m
        m = mem[r] - mem_m
        for t in range(shapes):
            ok = fit_count[r, t] - gpus >= k[t] and c >= cpu_t[t] and m >= mem_t[t] and access[r, t]
            out[i, t] = (np.float32(1.0) if ok else np.float32(0.0)) * (fit_free[r, t] - taken)
    return out


@njit(cache=True)
def slot_matrix(
    rows: np.ndarray,
    slots: np.ndarray,
    free: np.ndarray,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    need: np.ndarray,
    k: np.ndarray,
    cpu_t: np.ndarray,
    mem_t: np.ndarray,
    access: np.ndarray,
    cores: int,
    cpu_m: int,
    mem_m: int,
) -> np.ndarray:
    """(pairs, T) float64: free cores usable by each shape on node rows[i] once a shared pod took `cores`
    of its GPU slots[i], `cpu_m` of CPU and `mem_m` of memory."""
    shapes = k.shape[0]
    out = np.empty((rows.shape[0], shapes), dtype=np.float64)
    for i in range(rows.shape[0]):
        r = rows[i]
        f = free[r, slots[i]]
        after = f - cores
        c = cpu[r] - cpu_m
        m = mem[r] - mem_m
        for t in range(shapes):
            was = 1 if f >= need[t] else 0
            now = 1 if after >= need[t] else 0
            count = fit_count[r, t] - was + now
            total = (np.float64(fit_free[r, t]) - np.float64(was * f)) + np.float64(now * after)
            ok = count >= k[t] and c >= cpu_t[t] and m >= mem_t[t] and access[r, t]
            out[i, t] = (1.0 if ok else 0.0) * total
    return out


@njit(cache=True)
def distinct_slots(free: np.ndarray, least: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each node's GPUs: the first GPU of the node with the same free cores, and the (row, slot) of
    each such first GPU with at least `least` free, in row-major order."""
    n, gpus = free.shape
    first = np.empty((n, gpus), dtype=np.int64)
    sub = np.empty(n * gpus, dtype=np.int64)
    slots = np.empty(n * gpus, dtype=np.int64)
    m = 0
    for r in range(n):
        for g in range(gpus):
            j = 0
            while free[r, j] != free[r, g]:
                j += 1
            first[r, g] = j
            if j == g and free[r, g] >= least:
                sub[m] = r
                slots[m] = g
                m += 1
    return first, sub[:m], slots[:m]


@njit(cache=True)
def starved(
    rows: np.ndarray,
    free: np.ndarray,
    cpu: np.ndarray,
    need: np.ndarray,
    price: np.ndarray,
    taken: int,
    cpu_m: int,
    weight: float,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    mem: np.ndarray,
    access: np.ndarray,
    k: np.ndarray,
    mem_t: np.ndarray,
    gpu_per_mib: np.ndarray,
    w: np.ndarray,
    mem_m: int,
) -> np.ndarray:
    """Change in the price of the GPU capacity (percent) the node's free CPU could not feed at its `need` once a
    pod took `taken` of its GPU capacity and `cpu_m` of its CPU, times `weight` x `price` (0 where need is 0),
    plus `weight` x `memory_short`'s sum for the pod's `mem_m` of memory (`_memory_sum`)."""
    out = np.empty(rows.shape[0], dtype=np.float64)
    per_min = np.inf  # the least GPU percent per MiB of the shapes that ask memory
    for t in range(gpu_per_mib.shape[0]):
        if 0.0 < gpu_per_mib[t] < per_min:
            per_min = gpu_per_mib[t]
    for i in range(rows.shape[0]):
        r = rows[i]
        f = 0
        for g in range(free.shape[1]):
            f += free[r, g]
        # Where the memory left feeds all the node's free capacity even at the hungriest shape's memory per GPU
        # percent, every shape's term is 0 before and after (a shape's capacity is at most the node's), so
        # `_memory_sum` would add only zeros: skipped, the same float
        short = 0.0
        if per_min < np.inf and (np.float64(mem[r]) - mem_m) * per_min < f:
            short = _memory_sum(r, fit_count, fit_free, mem, access, k, mem_t, gpu_per_mib, w, taken, mem_m)
        cpu_part = 0.0
        if need[r] > 0.0:
            before = f - cpu[r] / need[r]
            after = (f - taken) - (cpu[r] - cpu_m) / need[r]
            cpu_part = weight * price[r] * ((after if after > 0.0 else 0.0) - (before if before > 0.0 else 0.0))
        out[i] = cpu_part + weight * short
    return out


@njit(cache=True)
def _memory_sum(
    r: int,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    mem: np.ndarray,
    access: np.ndarray,
    k: np.ndarray,
    mem_t: np.ndarray,
    gpu_per_mib: np.ndarray,
    w: np.ndarray,
    taken: int,
    mem_m: int,
) -> float:
    """`memory_short` of node `r`: over the shapes that can use it and ask memory, in order, the sum of each
    one's weight times its change in the capacity of its GPUs with room that the node's free memory cannot
    feed once a pod took `taken` of it and `mem_m` of the memory, in the NumPy path's operations and types
    (its sum is a cumulative sum: shape after shape, so equal; the shapes skipped here add 0 there)."""
    m = np.float64(mem[r])
    s = 0.0
    for t in range(k.shape[0]):
        per = gpu_per_mib[t]
        if per > 0 and fit_count[r, t] >= k[t] and mem[r] >= mem_t[t] and access[r, t]:
            f = np.float64(fit_free[r, t])
            before = max(0.0, f - m * per)
            after = max(0.0, max(f - taken, 0.0) - (m - mem_m) * per)
            s += (after - before) * np.float64(w[t])
    return s


@njit(cache=True)
def need_rows(
    rows: np.ndarray,
    fit_count: np.ndarray,
    mem: np.ndarray,
    access: np.ndarray,
    k: np.ndarray,
    mem_t: np.ndarray,
    need_cpu: np.ndarray,
    need_gpu: np.ndarray,
    cpu_only: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(rows,) `need_and_price`'s need and the (rows, T) float64 0/1 matrix of the shapes that can use the
    node's free GPUs (a model they allow, enough GPUs with room, enough memory), whose product with the
    weights is the price. The sums of the shapes' CPU and GPU demand add integers: exact in any order, so
    equal to the NumPy path's matrix products."""
    out = np.zeros((rows.shape[0], k.shape[0]), dtype=np.float64)
    need = np.zeros(rows.shape[0], dtype=np.float64)
    for i in range(rows.shape[0]):
        r = rows[i]
        cpu_of = 0.0
        gpu_of = 0.0
        for t in range(k.shape[0]):
            if fit_count[r, t] >= k[t] and mem[r] >= mem_t[t] and access[r, t]:
                out[i, t] = 1.0
                cpu_of += need_cpu[t]
                gpu_of += need_gpu[t]
        if gpu_of > 0:
            need[i] = cpu_of / gpu_of + cpu_only
    return need, out


@njit(cache=True)
def need_price(
    rows: np.ndarray,
    free: np.ndarray,
    fit_count: np.ndarray,
    mem: np.ndarray,
    access: np.ndarray,
    k: np.ndarray,
    mem_t: np.ndarray,
    need_cpu: np.ndarray,
    need_gpu: np.ndarray,
    cpu_only: float,
    w: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """`need_and_price` of these rows: `need_rows` and the product of its matrix with the float64 weights `w`
    as NumPy computes it, once per group of nodes alike (`alike`) and copied to the others. A row's need and
    price follow from its GPUs' free cores (its per-shape counts are counted from them), memory and access
    alone, and its float64 product rounds alike in any batch of rows; so `alike` is asked with every other
    field equal (zeros). After new weights every node is priced again, most of them idle or filled alike."""
    n = free.shape[0]
    group, firsts = alike(
        rows, free, np.zeros(n, dtype=np.int64), mem, access, np.zeros(n, dtype=np.float32), np.zeros(n), np.zeros(n)
    )
    some = rows[firsts]
    per_gpu, uses = need_rows(some, fit_count, mem, access, k, mem_t, need_cpu, need_gpu, cpu_only)
    price = matvec64(uses, w)
    return per_gpu[group], price[group]


@njit(cache=True)
def weights(
    p: np.ndarray, hosts: np.ndarray, room: np.ndarray, free_total: int, scarce: int, pressure: int, now: np.ndarray
) -> tuple[np.ndarray, bool]:
    """(T,) float32: the mix `p` with the scarcity and pressure boosts, in the NumPy path's operations and
    types (a boost is a power of two, so each product is exact); and whether they differ from `now`."""
    out = np.empty(p.shape[0], dtype=np.float32)
    for t in range(p.shape[0]):
        w = p[t]
        if scarce and hosts[t] < scarce:
            w = np.float32(np.float64(w) * np.exp2(np.ceil(np.log2(scarce / max(hosts[t], 1)))))
        if pressure:
            ratio = min(max(free_total / max(room[t], 1.0), 1.0), np.float64(pressure))
            w = np.float32(np.float64(w) * np.exp2(np.rint(np.log2(ratio))))
        out[t] = w
    changed = now.shape[0] != out.shape[0]
    for t in range(out.shape[0]):
        changed = changed or out[t] != now[t]
    return out, changed


@njit(cache=True)
def upkeep(
    rows: np.ndarray,
    usable: np.ndarray,
    cores_free: np.ndarray,
    cpu_free: np.ndarray,
    mem_free: np.ndarray,
    need: np.ndarray,
    k: np.ndarray,
    cpu_t: np.ndarray,
    mem_t: np.ndarray,
    access: np.ndarray,
    free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    hosts: np.ndarray,
    room: np.ndarray,
    free_total: np.ndarray,
    p: np.ndarray,
    scarce: int,
    pressure: int,
    now: np.ndarray,
    need_cpu: np.ndarray,
    need_gpu: np.ndarray,
    cpu_only: float,
    node_need: np.ndarray,
    node_price: np.ndarray,
    capacity: np.ndarray,
) -> tuple[np.ndarray, bool]:
    """A placement's upkeep in one call: `refresh_rows`, then `weights` from the moved `hosts`, `room` and
    `free_total`; if the weights stayed, the rows' usable capacity under them (`capacity[rows]`, the plugin's
    cached usable capacity; empty when it has none) as the NumPy path's `node_matrix @ w`, and, where
    `node_need` is not empty (cpu_balance), the rows' `need_and_price` into `node_need` and `node_price`
    (`need_rows`, its product with the weights in float64 as NumPy's). Returns (weights, changed)."""
    refresh_rows(
        rows, usable, cores_free, cpu_free, mem_free, need, k, cpu_t, mem_t, access, free, cpu, mem, fit_count,
        fit_free, hosts, room, free_total,
    )  # fmt: skip
    w, changed = weights(p, hosts, room, free_total[0], scarce, pressure, now)
    if not changed and capacity.shape[0]:
        after = matvec32(node_matrix(rows, fit_count, fit_free, cpu, mem, k, cpu_t, mem_t, access, 0, 0, 0, 0), now)
        for i in range(rows.shape[0]):
            capacity[rows[i]] = after[i]
        if node_need.shape[0]:
            per_gpu, uses = need_rows(rows, fit_count, mem, access, k, mem_t, need_cpu, need_gpu, cpu_only)
            price = matvec64(uses, now.astype(np.float64))
            for i in range(rows.shape[0]):
                node_need[rows[i]] = per_gpu[i]
                node_price[rows[i]] = price[i]
    return w, changed


@njit(cache=True)
def node_deltas(
    rows: np.ndarray,
    free: np.ndarray,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    k: np.ndarray,
    cpu_t: np.ndarray,
    mem_t: np.ndarray,
    access: np.ndarray,
    gpus: int,
    taken: int,
    cpu_m: int,
    mem_m: int,
    w: np.ndarray,
    usable: np.ndarray,
    node_need: np.ndarray,
    node_price: np.ndarray,
    pod_pct: int,
    weight: float,
    gpu_per_mib: np.ndarray,
    delta: np.ndarray,
) -> None:
    """delta[rows] for a CPU-only or whole-GPU pod taking `gpus` GPUs (`taken` cores), `cpu_m` and `mem_m`:
    `node_matrix`, its product with the weights `w` as NumPy computes it, the `starved` term (`pod_pct`: the
    pod's GPU percent; zeros when `weight` is 0) and `node_rows`, in one call."""
    after = matvec32(
        node_matrix(rows, fit_count, fit_free, cpu, mem, k, cpu_t, mem_t, access, gpus, taken, cpu_m, mem_m), w
    )
    extra = _starved_or_zero(
        rows, free, cpu, node_need, node_price, pod_pct, cpu_m, weight, fit_count, fit_free, mem, access, k, mem_t,
        gpu_per_mib, w, mem_m,
    )  # fmt: skip
    node_rows(rows, after, usable, taken, extra, delta)


@njit(cache=True)
def _starved_or_zero(
    rows: np.ndarray,
    free: np.ndarray,
    cpu: np.ndarray,
    need: np.ndarray,
    price: np.ndarray,
    taken: int,
    cpu_m: int,
    weight: float,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    mem: np.ndarray,
    access: np.ndarray,
    k: np.ndarray,
    mem_t: np.ndarray,
    gpu_per_mib: np.ndarray,
    w: np.ndarray,
    mem_m: int,
) -> np.ndarray:
    """`starved`, or zeros where cpu_balance is off (`weight` 0), as `Fragmentation._starved` gives them."""
    if weight == 0.0:
        return np.zeros(rows.shape[0])
    return starved(rows, free, cpu, need, price, taken, cpu_m, weight, fit_count, fit_free, mem, access, k, mem_t,
                   gpu_per_mib, w, mem_m)  # fmt: skip


@njit(cache=True)
def gpu_deltas(
    rows: np.ndarray,
    free: np.ndarray,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    need: np.ndarray,
    k: np.ndarray,
    cpu_t: np.ndarray,
    mem_t: np.ndarray,
    access: np.ndarray,
    cores: int,
    cpu_m: int,
    mem_m: int,
    w: np.ndarray,
    w32: np.ndarray,
    usable: np.ndarray,
    node_need: np.ndarray,
    node_price: np.ndarray,
    pod_pct: int,
    weight: float,
    gpu_per_mib: np.ndarray,
    delta: np.ndarray,
) -> None:
    """delta[rows] for a shared pod taking `cores` of one GPU: `slot_rows`, the product with the weights `w`
    (float64, as NumPy promotes the float32 weights `w32`) as NumPy computes it, the `starved` term (`pod_pct`:
    the pod's GPU percent; zeros when `weight` is 0) and `gpu_rows`, in one call; once per group of nodes alike
    (`alike`), the others' rows copied from their group's first."""
    group, firsts = alike(rows, free, cpu, mem, access, usable, node_need, node_price)
    some = rows[firsts]
    first, sub, slots, matrix = slot_rows(
        some, free, fit_count, fit_free, cpu, mem, need, k, cpu_t, mem_t, access, cores, cpu_m, mem_m
    )
    extra = _starved_or_zero(
        some, free, cpu, node_need, node_price, pod_pct, cpu_m, weight, fit_count, fit_free, mem, access, k, mem_t,
        gpu_per_mib, w32, mem_m,
    )  # fmt: skip
    gpu_rows(some, first, sub, slots, matvec64(matrix, w), usable, free, cores, extra, delta)
    for i in range(rows.shape[0]):
        r, like = rows[i], some[group[i]]
        if r != like:
            for g in range(delta.shape[1]):  # element by element: a row view per row costs more than its copy
                delta[r, g] = delta[like, g]


@njit(cache=True, inline="always")
def same_node(
    o: int,
    r: int,
    free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    words: np.ndarray,
    bits_u: np.ndarray,
    bits_n: np.ndarray,
    bits_p: np.ndarray,
) -> bool:
    """Nodes `o` and `r` are alike for `alike`: the same free cores on each GPU, CPU, memory, access (`words`:
    the (N, T) access rows as unsigned words) and the same bits of usable capacity, need and price. Without
    early exits: nodes compared are usually alike."""
    diff = (cpu[o] ^ cpu[r]) | (mem[o] ^ mem[r]) | (np.int64(bits_u[o]) ^ np.int64(bits_u[r]))
    diff |= (bits_n[o] ^ bits_n[r]) | (bits_p[o] ^ bits_p[r])
    for g in range(free.shape[1]):
        diff |= free[o, g] ^ free[r, g]
    x = words[o, 0] ^ words[r, 0] if words.shape[1] else words.dtype.type(0)
    for t in range(1, words.shape[1]):
        x |= words[o, t] ^ words[r, t]
    return bool(diff == 0 and x == 0)


@njit(cache=True)
def alike(
    rows: np.ndarray,
    free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    access: np.ndarray,
    usable: np.ndarray,
    node_need: np.ndarray,
    node_price: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Group these rows' nodes by everything a shared pod's change in fragmentation there is computed from:
    each GPU's free cores (the per-shape sums follow from them: integers counted and summed), CPU, memory,
    the shapes' access, the cached usable capacity, need and price (bit for bit). Nodes alike get the same
    change bit for bit (a float64 product rounds a row alike in any batch of rows), so it is computed once
    per group: after new weights most nodes a shape fits on are alike (idle, or filled alike). Returns (each
    row's group, each group's first row), indices into `rows`. `access` (C-contiguous) is compared eight
    columns to a word where its width allows (`_alike`)."""
    if access.shape[1] % 8 == 0:
        return _alike(rows, free, cpu, mem, access.view(np.uint64), usable, node_need, node_price)
    return _alike(rows, free, cpu, mem, access.view(np.uint8), usable, node_need, node_price)


@njit(cache=True)
def _alike(
    rows: np.ndarray,
    free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    words: np.ndarray,
    usable: np.ndarray,
    node_need: np.ndarray,
    node_price: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """`alike` by a hash table with linear probing (the access rows are compared, not hashed: nodes alike but
    for it are few), after a look at the previous row's group: nodes alike come in runs (idle ones, those
    filled alike), which then skip the hash."""
    n, gpus = rows.shape[0], free.shape[1]
    group = np.arange(n)
    if n < _ALIKE_FROM:
        return group, group
    bits_u, bits_n, bits_p = usable.view(np.int32), node_need.view(np.int64), node_price.view(np.int64)
    size = 16
    while size < 2 * n:
        size *= 2
    table = np.full(size, -1, dtype=np.int64)
    firsts = np.empty(n, dtype=np.int64)
    odd = np.uint64(0x9E3779B97F4A7C15)  # each value times its own odd constant, summed: no serial chain
    m = 0
    last = -1
    for i in range(n):
        r = rows[i]
        if last >= 0 and same_node(rows[firsts[last]], r, free, cpu, mem, words, bits_u, bits_n, bits_p):
            group[i] = last
            continue
        h = np.uint64(cpu[r]) * odd + np.uint64(mem[r]) * (odd + np.uint64(2))
        h += np.uint64(bits_u[r]) * (odd + np.uint64(4)) + np.uint64(bits_n[r]) * (odd + np.uint64(6))
        h += np.uint64(bits_p[r]) * (odd + np.uint64(8))
        for g in range(gpus):
            h += np.uint64(free[r, g]) * (odd + np.uint64(10 + 2 * g))
        h ^= h >> np.uint64(29)
        s = np.int64((h * odd) >> np.uint64(40)) & (size - 1)
        while True:
            j = table[s]
            if j < 0:
                table[s] = m
                firsts[m] = i
                group[i] = m
                m += 1
                break
            if same_node(rows[firsts[j]], r, free, cpu, mem, words, bits_u, bits_n, bits_p):
                group[i] = j
                break
            s = (s + 1) & (size - 1)
        last = group[i]
    return group, firsts[:m]


@njit(cache=True)
def gpu_exponents(
    delta: np.ndarray, nodes: np.ndarray, slots: np.ndarray, fit: np.ndarray, least: np.ndarray, first: np.ndarray
) -> np.ndarray:
    """(k,) the exponent of FGD's score mapping (`Fragmentation._exponent`) of each node's least change over
    the GPUs `slots[fit[i]]` allows (inf where it allows none, so 50): the node's `least` change where the
    mask allows the `first` GPU with it (the scan below would stop its changes there: none before is as
    small, none after smaller), else that scan."""
    out = np.empty(nodes.shape[0], dtype=np.float64)
    for i in range(nodes.shape[0]):
        n, f = nodes[i], fit[i]
        if slots[f, first[n]]:
            out[i] = _clipped(least[n])
            continue
        best = np.inf
        for g in range(delta.shape[1]):  # selects, not branches: which slots are allowed is hard to predict
            v = delta[n, g] if slots[f, g] else np.inf
            best = v if v < best else best
        out[i] = _clipped(best)
    return out


@njit(cache=True)
def node_exponents(delta: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """(k,) the exponent of FGD's score mapping of each node's change."""
    out = np.empty(nodes.shape[0], dtype=np.float64)
    for i in range(nodes.shape[0]):
        out[i] = _clipped(delta[nodes[i]])
    return out


@njit(cache=True)
def scores(e: np.ndarray, fit: np.ndarray, n: int, quantize: bool) -> np.ndarray:
    """(n,) FGD's score, 100 / (1 + e[i]) (floored when `quantize`), at fit[i], 0 elsewhere: the rest of
    `Fragmentation._to_score` after NumPy's exp (`e`), in its operations and order."""
    out = np.zeros(n)
    for i in range(fit.shape[0]):
        v = 100.0 / (e[i] + 1.0)
        out[fit[i]] = np.floor(v) if quantize else v
    return out


@njit(cache=True)
def exp_in_place(x: np.ndarray, call: np.ndarray) -> None:
    """x = np.exp(x) for a contiguous float64 `x`, by NumPy's own loop (blas.exp_loop; `call`: blas.EXP_CALL)."""
    if x.shape[0] == 0:
        return
    args = np.empty(5, dtype=np.int64)  # the data pointers (in, out), the length, the strides (in, out)
    args[0] = args[1] = np.int64(x.ctypes.data)
    args[2], args[3], args[4] = x.shape[0], 8, 8
    blas.exp_loop(call[0], args[0:2].ctypes, args[2:3].ctypes, args[3:5].ctypes, call[1])


@njit(cache=True)
def _fit_nodes(mask_nodes: np.ndarray, mask_rows: np.ndarray, whole: bool) -> tuple[np.ndarray, np.ndarray]:
    """(fit, nodes): the positions of a mask's nodes that fit, and those nodes (the positions themselves when
    the mask covers every node, `whole`, else mask_rows at them)."""
    fit = np.flatnonzero(mask_nodes)
    return fit, (fit if whole else mask_rows[fit])


@njit(cache=True)
def node_scores(
    mask_nodes: np.ndarray,
    mask_rows: np.ndarray,
    whole: bool,
    changed: np.ndarray,
    free: np.ndarray,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    k: np.ndarray,
    cpu_t: np.ndarray,
    mem_t: np.ndarray,
    access: np.ndarray,
    gpus: int,
    taken: int,
    cpu_m: int,
    mem_m: int,
    w: np.ndarray,
    usable: np.ndarray,
    node_need: np.ndarray,
    node_price: np.ndarray,
    pod_pct: int,
    weight: float,
    gpu_per_mib: np.ndarray,
    delta: np.ndarray,
    quantize: bool,
    call: np.ndarray,
) -> np.ndarray:
    """A CPU-only or whole-GPU pod's scores on a mask's nodes in one call: `node_deltas` of the `changed` rows
    into the shape's cached `delta`, then on the nodes that fit FGD's mapping (`_clipped`, NumPy's exp,
    `scores`): `Fragmentation.score`'s NumPy path, in its operations and order."""
    if changed.shape[0]:
        node_deltas(
            changed, free, fit_count, fit_free, cpu, mem, k, cpu_t, mem_t, access, gpus, taken, cpu_m, mem_m, w,
            usable, node_need, node_price, pod_pct, weight, gpu_per_mib, delta,
        )  # fmt: skip
    fit, nodes = _fit_nodes(mask_nodes, mask_rows, whole)
    x = node_exponents(delta, nodes)
    exp_in_place(x, call)
    return scores(x, fit, mask_nodes.shape[0], quantize)


@njit(cache=True)
def gpu_scores(
    mask_nodes: np.ndarray,
    mask_rows: np.ndarray,
    whole: bool,
    mask_slots: np.ndarray,
    changed: np.ndarray,
    valid: np.ndarray,
    least: np.ndarray,
    first: np.ndarray,
    free: np.ndarray,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    need: np.ndarray,
    k: np.ndarray,
    cpu_t: np.ndarray,
    mem_t: np.ndarray,
    access: np.ndarray,
    cores: int,
    cpu_m: int,
    mem_m: int,
    w: np.ndarray,
    w32: np.ndarray,
    usable: np.ndarray,
    node_need: np.ndarray,
    node_price: np.ndarray,
    pod_pct: int,
    weight: float,
    gpu_per_mib: np.ndarray,
    delta: np.ndarray,
    quantize: bool,
    call: np.ndarray,
) -> np.ndarray:
    """A shared pod's scores on a mask's nodes in one call: the cached `delta` rows of the nodes that fit and
    are not `valid` (those `changed` no longer are) by `gpu_deltas`, with each row's `least` change and the
    `first` GPU with it, then each node's least change over the GPUs `mask_slots` allows mapped as FGD does
    (`gpu_exponents`, NumPy's exp, `scores`): `Fragmentation.score`'s NumPy path, in its operations and
    order."""
    for i in range(changed.shape[0]):
        valid[changed[i]] = False
    fit, nodes = _fit_nodes(mask_nodes, mask_rows, whole)
    stale = np.empty(nodes.shape[0], dtype=np.int64)
    m = 0
    for i in range(nodes.shape[0]):
        if not valid[nodes[i]]:
            stale[m] = nodes[i]
            valid[nodes[i]] = True
            m += 1
    if m:
        gpu_deltas(
            stale[:m], free, fit_count, fit_free, cpu, mem, need, k, cpu_t, mem_t, access, cores, cpu_m, mem_m, w,
            w32, usable, node_need, node_price, pod_pct, weight, gpu_per_mib, delta,
        )  # fmt: skip
        for i in range(m):
            r, best, at = stale[i], np.inf, 0
            for g in range(delta.shape[1]):  # as `gpu_exponents` scans: the first GPU with the least change
                if delta[r, g] < best:
                    best, at = delta[r, g], g
            least[r], first[r] = best, at
    x = gpu_exponents(delta, nodes, mask_slots, fit, least, first)
    exp_in_place(x, call)
    return scores(x, fit, mask_nodes.shape[0], quantize)


@njit(cache=True)
def gpu_order(
    node: int,
    slots: np.ndarray,
    free: np.ndarray,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    need: np.ndarray,
    k: np.ndarray,
    cpu_t: np.ndarray,
    mem_t: np.ndarray,
    access: np.ndarray,
    cores: int,
    cpu_m: int,
    mem_m: int,
    w: np.ndarray,
    usable: np.ndarray,
) -> np.ndarray:
    """`slots` of `node` by a shared pod's change in fragmentation there (`slot_matrix`, its product with the
    float64 weights `w` as NumPy computes it, `-cores - after + before`), least first, equal changes by their
    free cores, least first, and otherwise as given: `Fragmentation.gpu_order`'s `np.lexsort` (stable)."""
    m = slots.shape[0]
    rows = np.full(m, node)
    matrix = slot_matrix(rows, slots, free, fit_count, fit_free, cpu, mem, need, k, cpu_t, mem_t, access, cores,
                         cpu_m, mem_m)  # fmt: skip
    after = matvec64(matrix, w)
    delta = np.empty(m)
    for i in range(m):
        delta[i] = (np.float64(-cores) - after[i]) + np.float64(usable[node])
    return lexsorted(slots, delta, free[node])


@njit(cache=True)
def lexsorted(slots: np.ndarray, delta: np.ndarray, free: np.ndarray) -> np.ndarray:
    """`slots[np.lexsort((free[slots], delta))]` for a few slots: by `delta`, equal ones by their `free`, and
    otherwise as given (an insertion sort, stable as lexsort's). `delta` is sorted in place."""
    order = slots.copy()
    for i in range(1, order.shape[0]):
        d, s, j = delta[i], order[i], i
        while j > 0 and (delta[j - 1] > d or (delta[j - 1] == d and free[order[j - 1]] > free[s])):
            delta[j], order[j] = delta[j - 1], order[j - 1]
            j -= 1
        delta[j], order[j] = d, s
    return order


@njit(cache=True)
def _clipped(delta: float) -> float:
    """The decrease in GPUs, clipped to ±50: `Fragmentation._exponent`'s arithmetic."""
    return min(max(delta / 100.0, -50.0), 50.0)


@njit(cache=True)
def slot_rows(
    rows: np.ndarray,
    free: np.ndarray,
    fit_count: np.ndarray,
    fit_free: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    need: np.ndarray,
    k: np.ndarray,
    cpu_t: np.ndarray,
    mem_t: np.ndarray,
    access: np.ndarray,
    cores: int,
    cpu_m: int,
    mem_m: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`distinct_slots` of these rows' GPUs and the `slot_matrix` of each first GPU with room for `cores`, in
    one call: (first, sub, slots, matrix), `sub` indexing `rows`."""
    first, sub, slots = distinct_slots(free[rows], cores)
    matrix = slot_matrix(
        rows[sub], slots, free, fit_count, fit_free, cpu, mem, need, k, cpu_t, mem_t, access, cores, cpu_m, mem_m
    )
    return first, sub, slots, matrix


@njit(cache=True)
def gpu_rows(
    rows: np.ndarray,
    first: np.ndarray,
    sub: np.ndarray,
    slots: np.ndarray,
    after: np.ndarray,
    usable: np.ndarray,
    free: np.ndarray,
    cores: int,
    starved: np.ndarray,
    delta: np.ndarray,
) -> None:
    """delta[rows]: each GPU's change in fragmentation if a shared pod takes `cores` of it (`after[j]`: the
    usable capacity once it took GPU slots[j] of row sub[j]), that of the first GPU of its node with the same
    free cores (`first`), inf where fewer than `cores` cores are free, plus the row's `starved` term: the
    NumPy path's `-cores - after + before` and its spreading (`Fragmentation._gpu_deltas`), in their types
    and order, written in place."""
    n, gpus = first.shape
    d = np.empty(sub.shape[0], dtype=np.float64)
    at = np.full((n, gpus), -1, dtype=np.int64)
    for j in range(sub.shape[0]):
        d[j] = (np.float64(-cores) - after[j]) + np.float64(usable[rows[sub[j]]])
        at[sub[j], slots[j]] = j
    for i in range(n):
        r = rows[i]
        for g in range(gpus):
            j = at[i, first[i, g]]
            delta[r, g] = (d[j] if free[r, g] >= cores and j >= 0 else np.inf) + starved[i]


@njit(cache=True)
def node_rows(
    rows: np.ndarray, after: np.ndarray, usable: np.ndarray, taken: int, starved: np.ndarray, delta: np.ndarray
) -> None:
    """delta[rows]: each node's change in fragmentation if a CPU-only or whole-GPU pod taking `taken` cores
    goes there (`after[i]`: the usable capacity then, float32 as `usable`), plus the row's `starved` term: the
    NumPy path's `-taken - after + before` in float32, then the starved term in float64."""
    for i in range(rows.shape[0]):
        r = rows[i]
        delta[r] = np.float64((np.float32(-taken) - after[i]) + usable[r]) + starved[i]


@njit(cache=True)
def matvec32(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """`a @ w` for a C-contiguous (m, T) float32 matrix and (T,) float32 vector, bit for bit as NumPy
    (plugins/blas.py)."""
    m, t = a.shape
    out = np.zeros(m, dtype=np.float32)
    if m == 1 and t > 0:
        out[0] = blas.sdot(t, a.ctypes, 1, w.ctypes, 1)
    elif m > 1 and t > 0:
        blas.sgemv(
            blas.COL_MAJOR, blas.TRANS, t, m, np.float32(1.0), a.ctypes, t, w.ctypes, 1, np.float32(0.0), out.ctypes, 1
        )
    return out


@njit(cache=True)
def matvec64(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """`a @ w` for a C-contiguous (m, T) float64 matrix and (T,) float64 vector, bit for bit as NumPy."""
    m, t = a.shape
    out = np.zeros(m, dtype=np.float64)
    if m == 1 and t > 0:
        out[0] = blas.ddot(t, a.ctypes, 1, w.ctypes, 1)
    elif m > 1 and t > 0:
        blas.dgemv(blas.COL_MAJOR, blas.TRANS, t, m, 1.0, a.ctypes, t, w.ctypes, 1, 0.0, out.ctypes, 1)
    return out
