"""What a bound pod holds on its node, read from its HAMi record whatever its shape (several containers, init
containers, MIG instances), so no card is booked twice; and holding it in the engine's state."""

from __future__ import annotations

import re

from fairgpu.k8s import hami
from fairgpu.k8s.translate import PodInfo
from fairgpu.model.node import mig_candidates
from fairgpu.state import MIG_WHOLE, ClusterState, Placement

_BEYOND_ANY_CARD = 2**31 - 1  # cores no card has (devcore is an int32), so hold() takes all the card has left


def holdings(p: PodInfo, state: ClusterState, ni: int) -> tuple[list[Placement], str | None]:
    """What a bound pod holds on node `ni`, read from its HAMi record (`hami.io/vgpu-devices-allocated`)
    whatever its shape, and why part of it could not be read.

    One Placement when the record is one container's cards at one cores value (what fairgpu writes, and
    the engine can adopt as a pod); otherwise CPU and memory in one Placement and one per card entry (several
    GPU containers, init containers, cards shared between them). A record that does not decode names its
    cards as best it can and they count as fully used (see hold); a GPU pod without a record takes cards that
    fit its request, so none is booked twice.
    """
    spec, node = p.spec, state.nodes[ni]
    base = Placement(ni, cpu_m=spec.cpu_m, memory_mib=spec.memory_mib)
    raw = p.annotations.get(hami.ALLOCATED)
    if raw is None or p.annotations.get(hami.VGPU_NODE) != p.node:
        if spec.gpu is None:
            return [base], None
        fits = [s for s in range(len(node.gpus)) if state.fits(state.placement_for(spec, ni, (s,)))]
        if len(fits) < spec.gpu.count:
            return [base], f"GPU pod on {node.name} without a HAMi allocation record, and no room for its GPUs"
        return [state.placement_for(spec, ni, fits[: spec.gpu.count])], None
    slot_of = {g.uuid: j for j, g in enumerate(node.gpus)}
    try:
        segments = hami.decode_devices(raw)
    except hami.FormatError as err:
        named = {slot_of[u] for u in re.split(r"[,:;]", raw) if u in slot_of}
        blocked = [_blocked(state, ni, s) for s in sorted(named)]
        return [base, *blocked], f"{err}; its cards count as fully used"
    foreign = sorted({d.uuid for seg in segments for d in seg if d.uuid not in slot_of})
    problem = f"cards not in {node.name}'s HAMi inventory (MIG, or gone): {', '.join(foreign)}" if foreign else None
    mig, mig_problem = _mig_reservations(p, state, ni, segments)
    problem = "; ".join(x for x in (problem, mig_problem) if x) or None
    filled = [seg for seg in segments if seg]
    if (
        filled
        and not foreign
        and (len(filled) == 1 or not any(segments[: p.init_containers]))
        and all(len({d.uuid for d in seg}) == len(seg) for seg in filled)
    ):  # one GPU container's cards, or app containers' in turn, as fairgpu writes them: one Placement
        keyed = [((ci, di), d) for ci, seg in enumerate(segments) for di, d in enumerate(seg)]
        on_mig = [mig.get(k, -1) for k, _ in keyed]
        return [
            Placement(
                ni,
                tuple(slot_of[d.uuid] for _, d in keyed),
                tuple(d.cores for _, d in keyed),
                tuple(d.memory_mib for _, d in keyed),
                spec.cpu_m,
                spec.memory_mib,
                tuple(len(seg) for seg in filled) if len(filled) > 1 else (),
                tuple(on_mig) if any(c != -1 for c in on_mig) else (),
            )
        ], problem
    cards = _collapse_init(segments[: p.init_containers], segments[p.init_containers :])
    held = [
        Placement(ni, (slot_of[uuid],), (cores if k == 0 else 0,), (mem if k == 0 else 0,))
        for uuid, (mem, cores, tasks) in cards.items()
        if uuid in slot_of and not state.gpu_mig[ni, slot_of[uuid]]
        for k in range(tasks)
    ]
    # MIG cards in such a record (init containers, shared): blocked whole, never under-counted
    held += [_blocked(state, ni, slot_of[u]) for u in cards if u in slot_of and state.gpu_mig[ni, slot_of[u]]]
    return [base, *held], problem


def _blocked(state: ClusterState, ni: int, s: int) -> Placement:
    """An entry no card can hold: hold() then takes all the card has left (every MIG slice, on a MIG card)."""
    return Placement(ni, (s,), (_BEYOND_ANY_CARD,), (0,), mig=(MIG_WHOLE,) if state.gpu_mig[ni, s] else ())


def _mig_reservations(
    p: PodInfo, state: ClusterState, ni: int, segments: list[list[hami.DeviceUse]]
) -> tuple[dict[tuple[int, int], int], str | None]:
    """Each entry on a MIG card → its MIG candidate, from the pod's `hami.io/vgpu-mig-allocations`
    (container and device index). An entry without a readable reservation blocks its card whole (HAMi marks
    such a card unhealthy)."""
    gpus = state.nodes[ni].gpus
    slot_of = {g.uuid: j for j, g in enumerate(gpus)}
    on_mig = {(ci, di): slot_of[d.uuid] for ci, seg in enumerate(segments) for di, d in enumerate(seg)
              if d.uuid in slot_of and state.gpu_mig[ni, slot_of[d.uuid]]}  # fmt: skip
    if not on_mig:
        return {}, None
    problem: str | None = None
    try:
        listed = hami.decode_mig_allocations(p.annotations.get(hami.MIG_ALLOCATIONS, ""))
    except hami.FormatError as err:
        listed, problem = [], str(err)
    found = {(a.container, a.device): a for a in listed}
    out: dict[tuple[int, int], int] = {}
    for key, slot in on_mig.items():
        a = found.get(key)
        dev = gpus[slot]
        cands = [(dev.mig[k].name, start, size) for k, start, size in mig_candidates(dev.mig)]
        hit = (a.profile, a.start, a.size) if a is not None and a.gpu == dev.uuid else None
        out[key] = cands.index(hit) if hit in cands else MIG_WHOLE
        if out[key] == MIG_WHOLE:
            problem = problem or f"{dev.uuid}: no matching {hami.MIG_ALLOCATIONS} reservation; the card counts as used"
    return out, problem


def _collapse_init(
    init: list[list[hami.DeviceUse]], app: list[list[hami.DeviceUse]]
) -> dict[str, tuple[int, int, int]]:
    """HAMi's `CollapseInitContainerUsage` (pkg/device/initContainer.go): init containers run one at a time
    before the app containers, so per card a pod holds max(init peak, app sum) of memory and of cores, and
    max(1 if an init container used it, app entries) task slots. Returns uuid → (MiB, cores, tasks)."""
    peak: dict[str, tuple[int, int]] = {}
    total: dict[str, tuple[int, int, int]] = {}
    for seg in init:
        for d in seg:
            m, c = peak.get(d.uuid, (0, 0))
            peak[d.uuid] = (max(m, d.memory_mib), max(c, d.cores))
    for seg in app:
        for d in seg:
            m, c, t = total.get(d.uuid, (0, 0, 0))
            total[d.uuid] = (m + d.memory_mib, c + d.cores, t + 1)
    out = {}
    for uuid in [*peak, *(u for u in total if u not in peak)]:
        (im, ic), (am, ac, at) = peak.get(uuid, (0, 0)), total.get(uuid, (0, 0, 0))
        out[uuid] = (max(im, am), max(ic, ac), max(1 if uuid in peak else 0, at, 1))
    return out


def hold(state: ClusterState, key: str, placements: list[Placement]) -> tuple[list[str], list[str]]:
    """Assign a bound pod's holdings under ledger keys `key`, `key#1`, …; an entry that does not fit (a card
    over-committed, cores over 100, an unreadable record) takes whatever the card still has, so the card
    counts as fully used and nothing else is booked on it. Returns the keys held and what did not fit."""
    keys: list[str] = []
    problems: list[str] = []
    for i, pl in enumerate(placements):
        k = key if i == 0 else f"{key}#{i}"
        if state.fits(pl):
            state.assign(k, pl)
            keys.append(k)
            continue
        name = state.node_names[pl.node]
        problems.append(f"{name}: {'GPU ' + str(list(pl.slots)) if pl.slots else 'CPU/memory'} over capacity")
        for s in pl.slots:
            whole = (MIG_WHOLE,) if state.gpu_mig[pl.node, s] else ()
            free = (int(state.gpu_cores_free[pl.node, s]),), (int(state.gpu_mem_free[pl.node, s]),)
            rest = Placement(pl.node, (s,), *free, mig=whole)
            if (rest.cores[0] or rest.mem_mib[0] or whole) and state.fits(rest):
                state.assign(f"{k}@{s}", rest)
                keys.append(f"{k}@{s}")
    return keys, problems
