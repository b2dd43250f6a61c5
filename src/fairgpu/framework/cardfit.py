"""HAMi's per-container Fit (pkg/scheduler/score.go `fitInDevices`, pkg/device/nvidia/device.go `Fit`) over
many nodes at once, for the pods whose cards HAMi chooses container by container: several GPU containers
(each fitted on the usage the ones before it left, so two containers may share a card), or a container
bound to one NUMA node (`nvidia.com/numa-bind`).

Cards are taken in HAMi's order: its card score (used/count + used cores/cores + used MiB/MiB) lowest first
under the default `spread` GPU policy, highest first under `binpack`; ties go to the higher NUMA node, then
the higher index, as HAMi's Fit walks its sorted list from the end. With numa-bind each container's cards
come from the first NUMA group in that walk (lowest first under binpack, highest under spread) that has
enough of them. Array operations over (nodes, cards) per container: no loop over nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairgpu.model.node import GPU_CORES
from fairgpu.model.pod import GpuRequest, PodSpec
from fairgpu.state import ClusterState


@dataclass(slots=True)
class _Usage:
    """The rows' card usage as the containers fitted so far leave it."""

    tasks: np.ndarray
    cores_free: np.ndarray
    mem_free: np.ndarray
    exclusive: np.ndarray
    mig_busy: np.ndarray


def card_ok(st: ClusterState, g: GpuRequest, rows: np.ndarray | slice, u: _Usage | None = None) -> np.ndarray:
    """(rows, G) bool: cards that pass HAMi's per-card checks for one container's request (slots, memory,
    cores, exclusivity on a 100-core card, a 0-core task on a card whose cores are all taken) and, on a MIG
    card, a MIG profile with that much memory on free slices (`CustomFilterRule`)."""
    tasks = st.gpu_tasks[rows] if u is None else u.tasks
    cores_free = st.gpu_cores_free[rows] if u is None else u.cores_free
    mem_free = st.gpu_mem_free[rows] if u is None else u.mem_free
    exclusive = st.gpu_exclusive[rows] if u is None else u.exclusive
    need = g.mem_mib if g.mem_mib else st.gpu_mem_cap[rows] * g.mem_pct // 100
    ok = st.gpu_usable[rows] & ~exclusive & (tasks < st.gpu_split[rows])
    ok &= (cores_free >= g.cores) & (mem_free >= need)
    if g.cores >= GPU_CORES:
        ok &= ~st.gpu_whole[rows] | (tasks == 0)
    if g.cores == 0:
        ok &= (cores_free > 0) | (st.gpu_cores_cap[rows] == 0)
    if st.has_mig:
        pick = st.mig.pick(rows, need, st.mig_busy[rows] if u is None else u.mig_busy)
        at = np.maximum(pick, 0)[..., None]
        mem = np.take_along_axis(st.mig_mem[rows], at, axis=2)[..., 0]
        cores = np.take_along_axis(st.mig_cores[rows], at, axis=2)[..., 0]
        # HAMi books the profile's memory and cores even past what is free; fairgpu keeps within the card
        ok &= ~st.gpu_mig[rows] | ((pick >= 0) & (mem <= mem_free) & (cores <= cores_free))
    return ok


def fit_containers(
    st: ClusterState, pod: PodSpec, rows: np.ndarray, allowed: np.ndarray | None = None
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Fit each GPU container of `pod` in turn on the nodes `rows`, within the `allowed` (rows, G) cards
    (other filters' verdicts; None = any). Returns (fits: (rows,) bool, the cards of each container:
    (rows, count) slot indices, meaningful where fits)."""
    n = len(rows)
    u = _Usage(
        st.gpu_tasks[rows].copy(), st.gpu_cores_free[rows].copy(), st.gpu_mem_free[rows].copy(),
        st.gpu_exclusive[rows].copy(), st.mig_busy[rows].copy(),
    )  # fmt: skip
    fits = np.ones(n, dtype=bool)
    picks: list[np.ndarray] = []
    binpack = pod.gpu_policy == "binpack"
    cols = np.arange(st.gpu_valid.shape[1])
    numa = st.gpu_numa[rows]
    for g in pod.gpus:
        ok = card_ok(st, g, rows, u)
        if allowed is not None:
            ok &= allowed
        if pod.gpu_mutex:
            ok &= u.tasks == 0
        if pod.numa_bind:
            ok &= numa == _numa_group(ok, numa, g.count, binpack)[:, None]
        fits &= ok.sum(axis=1) >= g.count
        score = _card_score(st, rows, u)
        key = np.where(ok, -score if binpack else score, np.inf)
        order = np.lexsort((-cols[None, :].repeat(n, 0), -numa, key), axis=1)[:, : g.count]
        picks.append(order)
        r = np.repeat(np.arange(n)[fits], g.count)
        s = order[fits].ravel()
        mem = np.full(len(s), g.mem_mib) if g.mem_mib else st.gpu_mem_cap[rows][r, s] * g.mem_pct // 100
        cores = np.full(len(s), g.cores)
        if st.has_mig:  # a MIG card books the profile HAMi picks, and its slices
            pick = st.mig.pick_cards(rows[r], s, mem, u.mig_busy[r, s])
            mig = pick >= 0
            rr, ss, cc = rows[r[mig]], s[mig], pick[mig]
            mem[mig], cores[mig] = st.mig_mem[rr, ss, cc], st.mig_cores[rr, ss, cc]
            u.mig_busy[r[mig], ss] |= st.mig_mask[rr, ss, cc]
        np.add.at(u.tasks, (r, s), 1)
        np.add.at(u.cores_free, (r, s), -cores)
        np.add.at(u.mem_free, (r, s), -mem)
        if g.cores >= GPU_CORES:
            u.exclusive[r, s] |= st.gpu_whole[rows][r, s]
    return fits, picks


def _card_score(st: ClusterState, rows: np.ndarray, u: _Usage) -> np.ndarray:
    """HAMi's card score (`ComputeScore`, weights 1): slots, cores and memory in use, as fractions."""
    split, cores, mem = st.gpu_split[rows], st.gpu_cores_cap[rows], st.gpu_mem_cap[rows]
    score = np.zeros(u.tasks.shape)
    for used, cap in ((u.tasks, split), (cores - u.cores_free, cores), (mem - u.mem_free, mem)):
        score += np.divide(used, cap, out=np.zeros(u.tasks.shape), where=cap > 0)
    return score


def _numa_group(ok: np.ndarray, numa: np.ndarray, count: int, binpack: bool) -> np.ndarray:
    """Per row, the NUMA node HAMi's walk settles on: the first (lowest under binpack, highest under
    spread) with `count` fitting cards; -1 where none has."""
    groups = np.unique(numa)
    groups = groups if binpack else groups[::-1]
    enough = np.stack([(ok & (numa == v)).sum(axis=1) >= count for v in groups], axis=1)
    return np.where(enough.any(axis=1), groups[np.argmax(enough, axis=1)], -1)


def placement_cards(st: ClusterState, pod: PodSpec, node: int, allowed: np.ndarray | None) -> tuple[int, ...]:
    """The cards, container after container, HAMi's Fit gives the pod on one node (which must fit)."""
    fits, picks = fit_containers(st, pod, np.array([node]), None if allowed is None else allowed[None, :])
    assert fits[0], "placement_cards is asked only about nodes the filter kept"
    return tuple(int(s) for p in picks for s in p[0])
