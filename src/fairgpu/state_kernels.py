"""ClusterState's per-placement booking as one compiled call (numba, cached on disk): HAMi's per-card checks
of `ClusterState.fits` and the updates of `_apply` over a placement's few card entries. In Python each entry
cost a dozen NumPy scalar reads and writes, ~10 µs a placement in the cycle; here the cost is the call.
MIG slices stay in Python (mig_slices.py): these kernels read and write only the arrays named here.
tests/test_state_kernels.py compares both with the rules written out in Python."""

from __future__ import annotations

import numpy as np
from numba import njit

from fairgpu.model.node import GPU_CORES

USABLE, HEALTHY, WHOLE, SPLIT, CORES = range(5)  # the fields of a card's `rules`
_A = np.ndarray
Booked = tuple[_A, _A, _A, _A, _A, _A, _A, _A, _A, _A]  # book's arrays, in its order


@njit(cache=True)
def book(
    cpu_free: np.ndarray,
    mem_free: np.ndarray,
    node_idle_gpus: np.ndarray,
    node_cores_free: np.ndarray,
    cores_free: np.ndarray,
    gpu_mem_free: np.ndarray,
    tasks: np.ndarray,
    exclusive: np.ndarray,
    idle: np.ndarray,
    rules: np.ndarray,
    node: int,
    entries: np.ndarray,
    cpu_m: int,
    memory_mib: int,
    sign: int,
    check: bool,
    distinct: bool,
) -> bool:
    """With `check`, whether a placement on `node` of `entries` (its slots, then its cores, then its MiB,
    k each) fits now, each entry seeing the ones before it (`distinct`: no two on one card, as in one
    container); then, if it does (or without `check`) and `sign` is not 0, book it (-1) or give it back
    (+1). Returns whether it fit (True without `check`). `rules`: (N, G, 5) each card's usable, healthy,
    whole (model.node.exclusive_on), split count and cores."""
    k = entries.shape[0] // 3
    slots, cores, mem = entries[:k], entries[k : 2 * k], entries[2 * k :]
    if check:
        if node < 0 or node >= cpu_free.shape[0]:
            return False
        if cpu_free[node] < cpu_m or mem_free[node] < memory_mib:
            return False
        g = rules.shape[1]
        # (tasks, free cores, free MiB, exclusive) after each entry: a later entry on its card starts there
        after = np.empty((k, 4), dtype=np.int64)
        for e in range(k):
            s, c, m = slots[e], cores[e], mem[e]
            if s < 0 or s >= g or rules[node, s, USABLE] == 0:
                return False
            before = -1
            for j in range(e - 1, -1, -1):
                if slots[j] == s:
                    before = j
                    break
            if before >= 0 and distinct:
                return False  # one container never gets two slots of one GPU
            if before >= 0:
                n_tasks, free_cores, free_mem = after[before, 0], after[before, 1], after[before, 2]
                excl = after[before, 3] != 0
            else:
                n_tasks, free_cores = np.int64(tasks[node, s]), np.int64(cores_free[node, s])
                free_mem, excl = np.int64(gpu_mem_free[node, s]), exclusive[node, s]
            alone = c >= GPU_CORES and rules[node, s, WHOLE] != 0
            if excl or n_tasks >= rules[node, s, SPLIT] or free_cores < c or free_mem < m:
                return False
            if alone and n_tasks > 0:
                return False  # HAMi: cores 100 on a 100-core card wants it to itself
            if c == 0 and free_cores == 0 and rules[node, s, CORES] != 0:
                return False  # HAMi: a 0-core task cannot land on a card whose cores are all taken
            after[e, 0], after[e, 1], after[e, 2], after[e, 3] = n_tasks + 1, free_cores - c, free_mem - m, alone
    if sign == 0:
        return True
    cpu_free[node] += sign * cpu_m
    mem_free[node] += sign * memory_mib
    if k == 0:
        return True
    n_idle, n_cores = np.int64(node_idle_gpus[node]), np.int64(node_cores_free[node])
    for e in range(k):
        s, c, m = slots[e], cores[e], mem[e]
        cores_free[node, s] += sign * c
        n_cores += sign * c
        gpu_mem_free[node, s] += sign * m
        t = tasks[node, s] - sign
        tasks[node, s] = t
        if c >= GPU_CORES and rules[node, s, WHOLE] != 0:
            exclusive[node, s] = sign < 0
        now = t == 0 and rules[node, s, HEALTHY] != 0
        n_idle += np.int64(now) - np.int64(idle[node, s])
        idle[node, s] = now
    node_idle_gpus[node] = n_idle
    node_cores_free[node] = n_cores
    return True
