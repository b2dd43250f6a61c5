"""HAMi's per-container Fit (pkg/scheduler/score.go `fitInDevices`, pkg/device/nvidia/device.go `Fit`) over
many nodes at once, for the pods whose cards HAMi chooses container by container: several GPU containers
(each fitted on the usage the ones before it left, so two containers may share a card), a GPU policy or
scoring weights of the pod's own (hami.io/gpu-scheduler-policy, hami.io/device-scoring-weights), or a
container bound to one NUMA node (`nvidia.com/numa-bind`).

Cards are taken in HAMi's order (`_walk`): its weighted card score, NUMA and index as its policy chain says.
With numa-bind each container's cards come from the first NUMA group in that walk that has enough of them.
Under `topology-aware` HAMi collects every fitting card and takes the combination with the highest summed
pair scores (hami.io/node-nvidia-score), or for one card the worst connected. Array operations over (nodes,
cards) per container: no loop over nodes.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np

from fairgpu.model.constraints import gpu_sort_chain
from fairgpu.model.node import exclusive_on
from fairgpu.model.pod import GpuRequest, PodSpec
from fairgpu.state import ClusterState

VENDOR = "NVIDIA"  # the type HAMi's NVIDIA container requests carry


@dataclass(slots=True)
class _Usage:
    """The rows' card usage as the containers fitted so far leave it."""

    tasks: np.ndarray
    cores_free: np.ndarray
    mem_free: np.ndarray
    exclusive: np.ndarray
    mig_busy: np.ndarray


def open_cards(st: ClusterState, rows: np.ndarray | slice, u: _Usage | None = None) -> np.ndarray:
    """(rows, G) bool: cards that may take one more task, whatever it asks: usable, not taken whole, below their
    task limit (where every request's card check starts)."""
    tasks = st.gpu_tasks[rows] if u is None else u.tasks
    exclusive = st.gpu_exclusive[rows] if u is None else u.exclusive
    return st.gpu_usable[rows] & ~exclusive & (tasks < st.gpu_split[rows])


def card_ok(st: ClusterState, g: GpuRequest, rows: np.ndarray | slice, u: _Usage | None = None) -> np.ndarray:
    """(rows, G) bool: cards that pass HAMi's per-card checks for one container's request (slots, memory,
    cores, exclusivity on a 100-core card, a 0-core task on a card whose cores are all taken) and, on a MIG
    card, a MIG profile with that much memory on free slices (`CustomFilterRule`)."""
    cores_free = st.gpu_cores_free[rows] if u is None else u.cores_free
    mem_free = st.gpu_mem_free[rows] if u is None else u.mem_free
    need = g.mem_mib if g.mem_mib else st.gpu_mem_cap[rows] * g.mem_pct // 100
    ok = open_cards(st, rows, u)
    ok &= (cores_free >= g.cores) & (mem_free >= need)
    if g.exclusive:  # only a cores-100 task may want a card to itself: skip the arrays for the rest
        tasks = st.gpu_tasks[rows] if u is None else u.tasks
        ok &= ~exclusive_on(g.cores, st.gpu_whole[rows]) | (tasks == 0)
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
    numa = st.gpu_numa[rows]
    checked = st.gpu_usable[rows] if allowed is None else st.gpu_usable[rows] & allowed
    topology = pod.gpu_topology
    for g in pod.gpus:
        ok = card_ok(st, g, rows, u)
        if allowed is not None:
            ok &= allowed
        if pod.gpu_mutex:
            ok &= u.tasks == 0
        order = _walk(pod, _card_score(st, rows, u, g, pod.gpu_weights), u.tasks, numa)
        if pod.numa_bind and topology:
            ok &= _last_numa_run(order, checked, numa)
        elif pod.numa_bind:
            ok &= numa == _numa_group(ok, numa, g.count, _numa_ascending(pod))[:, None]
        ok_first = np.take_along_axis(order, np.argsort(~np.take_along_axis(ok, order, 1), axis=1, kind="stable"), 1)
        m = ok.sum(axis=1)
        fits &= m >= g.count
        chosen = _topology(st, rows, ok_first, m, g.count) if topology else ok_first[:, : g.count]
        picks.append(chosen)
        r = np.repeat(np.arange(n)[fits], g.count)
        s = chosen[fits].ravel()
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
        if g.exclusive:  # by the cores booked, as the state marks it: a MIG instance is no whole card
            u.exclusive[r, s] |= exclusive_on(cores, st.gpu_whole[rows][r, s])
    return fits, picks


def _card_score(
    st: ClusterState, rows: np.ndarray, u: _Usage, g: GpuRequest, weights: tuple[int, int, int]
) -> np.ndarray:
    """HAMi's card score (pkg/scheduler/policy/gpu_policy.go `ComputeScore`) in its float32:
    10 × (slot weight × tasks/count + core weight × used/total cores + memory weight × used/total MiB), 0 on a
    card with no count, cores or memory. The container's own request counts too only on a card whose type is
    the request's, "NVIDIA" exactly: HAMi's device plugin registers model names, so in practice never."""
    f = np.float32
    split, cores, mem = st.gpu_split[rows], st.gpu_cores_cap[rows], st.gpu_mem_cap[rows]
    live = (split > 0) & (cores > 0) & (mem > 0)
    tasks, used_cores, used_mem = u.tasks, cores - u.cores_free, mem - u.mem_free
    if VENDOR in st.models:
        typed = st.gpu_model[rows] == st.models.index(VENDOR)
        tasks = tasks + typed
        used_cores = used_cores + typed * g.cores
        used_mem = used_mem + typed * (mem * g.mem_pct // 100 if not g.mem_mib else g.mem_mib)
    one = np.ones_like(split)
    slot = tasks.astype(f) / np.where(live, split, one).astype(f)
    core = used_cores.astype(f) / np.where(live, cores, one).astype(f)
    memory = used_mem.astype(f) / np.where(live, mem, one).astype(f)
    ws, wc, wm = (f(w) for w in weights)
    return np.where(live, f(10) * (ws * slot + wc * core + wm * memory), f(0))


def _walk(pod: PodSpec, score: np.ndarray, tasks: np.ndarray, numa: np.ndarray) -> np.ndarray:
    """(rows, G): the cards in the order HAMi's Fit visits them, the end of its sorted list first
    (gpu_policy.go `Less`): a chain (a comma, or bare `numa`) by its keys then the lower index; `mutex` by
    tasks, then NUMA; under numa-bind NUMA first; else `binpack` fullest card first, anything else (`spread`)
    emptiest first, NUMA breaking ties. Equal cards go the higher column first (the card index)."""
    col = np.broadcast_to(-np.arange(score.shape[1]), score.shape)
    binpack = pod.gpu_policy == "binpack"
    chain = gpu_sort_chain(pod.gpu_policy, pod.numa_bind)
    if chain is not None:
        by = {"binpack": -score, "spread": score, "numa": -numa}
        keys = [by[k] for k in chain]
    elif pod.gpu_policy == "mutex":
        keys = [tasks, -numa]
    elif pod.numa_bind:
        keys = [numa, -score] if binpack else [-numa, score]
    else:
        keys = [-score if binpack else score, -numa]
    return np.lexsort((col, *reversed(keys)), axis=1)


def _numa_ascending(pod: PodSpec) -> bool:
    """HAMi's walk meets NUMA nodes lowest first only under a single `binpack` policy with numa-bind."""
    return pod.gpu_policy == "binpack"


def _numa_group(ok: np.ndarray, numa: np.ndarray, count: int, ascending: bool) -> np.ndarray:
    """Per row, the NUMA node HAMi's walk settles on: the first (lowest when ascending, else highest) with
    `count` fitting cards; -1 where none has."""
    groups = np.unique(numa)
    groups = groups if ascending else groups[::-1]
    enough = np.stack([(ok & (numa == v)).sum(axis=1) >= count for v in groups], axis=1)
    return np.where(enough.any(axis=1), groups[np.argmax(enough, axis=1)], -1)


def _last_numa_run(order: np.ndarray, checked: np.ndarray, numa: np.ndarray) -> np.ndarray:
    """(rows, G) the cards of the last NUMA run of HAMi's walk. With numa-bind its Fit starts afresh at every
    change of NUMA node among the cards that pass the health, cordon and type checks; under topology-aware it
    never stops early, so it keeps only the cards of the last run."""
    chk = np.take_along_axis(checked, order, 1)
    nm = np.take_along_axis(numa, order, 1)
    g = order.shape[1]
    last = g - 1 - np.argmax(chk[:, ::-1], axis=1)  # last checked position (any, when none is checked)
    group = nm[np.arange(len(nm)), last]
    other = chk & (nm != group[:, None])
    start = np.where(other.any(axis=1), g - np.argmax(other[:, ::-1], axis=1), 0)  # after the last change
    run = np.arange(g)[None, :] >= start[:, None]
    out = np.zeros_like(checked)
    np.put_along_axis(out, order, run, axis=1)
    return out


_COMBO_BUDGET = 1 << 22  # (rows × combinations × pairs) gathered at once by _topology


@functools.cache
def _combinations(m: int, k: int, g: int) -> tuple[np.ndarray, np.ndarray]:
    """(C, k) every k of walk positions 0..m-1, in the order HAMi's generateCombinations lists them, and (C,
    pairs) each one's pairs (earlier position first) as indices into a flattened g × g matrix."""
    combos = np.array(list(itertools.combinations(range(m), k)), dtype=np.int64).reshape(-1, k)
    a, b = (np.array(x, dtype=np.int64) for x in zip(*itertools.combinations(range(k), 2), strict=True))
    return combos, combos[:, a] * g + combos[:, b]


def _topology(st: ClusterState, rows: np.ndarray, ok_first: np.ndarray, m: np.ndarray, k: int) -> np.ndarray:
    """The cards HAMi's topology-aware Fit takes among the `m` fitting cards that `ok_first` lists in walk order
    (pkg/device/nvidia/device.go): all of them when exactly `k` fit; for one card the worst connected (least
    summed score to the other fitting cards, `computeWorstSingleCard`); for several the combination with the
    most summed pair scores (`computeBestCombination`), the first in HAMi's order on ties."""
    chosen = ok_first[:, :k].copy()
    if not st.has_pairs:
        return chosen  # every score 0: HAMi keeps the first card, the first combination
    pair = st.gpu_pair[rows]
    many = np.flatnonzero((m > k) & pair.any(axis=(1, 2)))
    if k == 1 and many.size:
        cand, p = ok_first[many], pair[many]
        at = np.arange(len(many))[:, None, None]
        inside = np.arange(cand.shape[1])[None, :] < m[many, None]
        total = np.where(inside[:, None, :], p[at, cand[:, :, None], cand[:, None, :]], 0).sum(axis=2)
        worst = np.where(inside, total, np.iinfo(np.int64).max).argmin(axis=1)
        chosen[many, 0] = cand[np.arange(len(many)), worst]
    elif many.size:
        combos, flat = _combinations(int(m[many].max()), k, ok_first.shape[1])
        step = max(1, _COMBO_BUDGET // (len(combos) * flat.shape[1]))
        for lo in range(0, len(many), step):
            sub = many[lo : lo + step]
            order = ok_first[sub]
            # pair scores by walk position (row a's score of b), then every combination's pairs in one gather
            walked = np.take_along_axis(np.take_along_axis(pair[sub], order[:, :, None], 1), order[:, None, :], 2)
            total = walked.reshape(len(sub), -1)[:, flat].sum(axis=2)
            total = np.where(combos.max(axis=1)[None, :] < m[sub, None], total, np.iinfo(np.int64).min)
            chosen[sub] = np.take_along_axis(order, combos[total.argmax(axis=1)], 1)
    return chosen


def placement_cards(st: ClusterState, pod: PodSpec, node: int, allowed: np.ndarray | None) -> tuple[int, ...]:
    """The cards, container after container, HAMi's Fit gives the pod on one node (which must fit)."""
    fits, picks = fit_containers(st, pod, np.array([node]), None if allowed is None else allowed[None, :])
    assert fits[0], "placement_cards is asked only about nodes the filter kept"
    return tuple(int(s) for p in picks for s in p[0])
