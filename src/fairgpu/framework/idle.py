"""Why GPUs are idle: every idle GPU-equivalent of the cluster, attributed to exactly one cause.

Read by drivers at sampling time (never in the cycle), from the state the cycle left behind. A node's idle
GPU capacity goes to the first cause that holds for the node, in the order of CAUSES after `unavailable`
(which is per GPU): so the causes partition the idle GPUs exactly. Work is one pass of the profile's
filters per distinct pending pod shape, with array operations over nodes; no loop over nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from fairgpu.framework import placement as pl
from fairgpu.framework.engine import Engine, Entry
from fairgpu.model.node import GPU_CORES
from fairgpu.model.pod import PodSpec

# In the order they are tested; docs/metrics.md ("Idle GPUs by cause") says what each means.
CAUSES = (
    "unavailable",  # the GPU is unhealthy or its node cordoned
    "reserved",  # held for a reservation (a starving workload, or a preemptor whose victims are leaving)
    "gang",  # a pending pod fits here, but its gang as a whole does not fit yet
    "limit",  # only workloads their queue's limit or static guarantee refuses would fit here
    "cpu_memory",  # a pending pod's GPUs would fit, but the node lacks its CPU or memory
    "fragmented",  # pending pods want this GPU model, but none fits the free slices
    "no_fit",  # nothing pending could run on this node's GPUs (or nothing pending at all)
    "held",  # only pods whose start the last cycle held back above their queue's share would fit (OverShareHold)
    "other",  # an admitted, non-gang pod would fit: the cycle has not yet taken it (e.g. evictions pending)
)


@dataclass(slots=True)
class _Fits:
    """(N,) per node: some pending pod of each kind fits there."""

    admitted: np.ndarray  # fully, and its queue admits it (not held back)
    held: np.ndarray  # fully, admitted, but held back above its queue's share in the last cycle
    gang: np.ndarray  # fully, and it belongs to a gang (admitted)
    refused: np.ndarray  # fully, but its queue refuses it
    gpus: np.ndarray  # on GPUs, ignoring CPU and memory
    wanted: np.ndarray  # the node has enough GPUs of a model it accepts, were they free


def idle_gpus(engine: Engine, now: float) -> dict[str, float]:
    """Idle GPU-equivalents now, by cause (CAUSES order); the values sum to the cluster's idle GPUs."""
    st = engine.state
    free = st.gpu_cores_free / GPU_CORES  # (N, G) idle GPU-equivalents, zero on padding slots
    down = ~st.gpu_healthy | ~st.schedulable[:, None]
    out = dict.fromkeys(CAUSES, 0.0)
    out["unavailable"] = float(free[down].sum())
    idle = np.where(down, 0.0, free).sum(axis=1)  # (N,)
    if not idle.any():
        return out
    cause = np.full(st.num_nodes, CAUSES.index("no_fit"))
    fits = _pending_fits(engine, idle > 0)
    # Assigned from the last cause to the first, so the first that holds wins.
    for name, where in (
        ("fragmented", fits.wanted),
        ("cpu_memory", fits.gpus),
        ("limit", fits.refused),
        ("held", fits.held),
        ("other", fits.admitted),
        ("gang", fits.gang),
        ("reserved", _reserved(engine, now)),
    ):
        cause[where] = CAUSES.index(name)
    per_cause = np.bincount(cause, weights=idle, minlength=len(CAUSES))
    for i, name in enumerate(CAUSES[1:], start=1):
        out[name] = float(per_cause[i])
    return out


def _reserved(engine: Engine, now: float) -> np.ndarray:
    held = np.zeros(engine.state.num_nodes, dtype=bool)
    for res in engine.reservations.values():
        if now <= res.fit.at:  # one whose start has passed is dropped when next met (reservations.py)
            held |= res.exclude
    return held


def _pending_fits(engine: Engine, candidates: np.ndarray) -> _Fits:
    n = engine.state.num_nodes
    fits = _Fits(*(np.zeros(n, dtype=bool) for _ in range(6)))
    # Pending workloads grouped by (queue, what must fit next): admission and fit are the same within one.
    groups: dict[tuple[int, int], Entry] = {}
    for entry in engine.pending.values():
        if not entry.terminating:
            groups.setdefault((entry.queue, entry.key), entry)
    # pod key → (pod, admitted anywhere, in a gang, in a workload neither in a gang nor held back)
    shapes: dict[tuple[object, ...], tuple[PodSpec, bool, bool, bool]] = {}
    for (q, key), entry in groups.items():
        admitted = engine.admission_refusal(entry) is None
        gang = engine.profile.gang and entry.workload.needed - len(entry.placed) > 1
        free = admitted and not gang and (q, key) not in engine.held_back
        for pod in entry.rest:
            if pod.gpu is None:
                continue
            _, was_admitted, was_gang, was_free = shapes.get(pod.key(), (pod, False, False, False))
            shapes[pod.key()] = (pod, was_admitted or admitted, was_gang or (admitted and gang), was_free or free)
    view, profile = engine.view, engine.profile
    for pod, admitted, gang, free in shapes.values():
        g = pod.gpu
        assert g is not None
        st = engine.state
        usable = st.model_slots(pod.allows_model) & st.gpu_usable & (st.gpu_mem_cap >= g.mem_mib)
        wanted = usable.sum(axis=1) >= g.count
        fits.wanted |= wanted & candidates
        on_gpus = pl.feasible(replace(pod, cpu_m=0, memory_mib=0), view, profile).nodes & candidates
        if not on_gpus.any():
            continue
        fits.gpus |= on_gpus
        full = pl.feasible(pod, view, profile).nodes & on_gpus
        if not admitted:
            fits.refused |= full
        elif gang:
            fits.gang |= full
        elif free:
            fits.admitted |= full
        else:
            fits.held |= full
    return fits
