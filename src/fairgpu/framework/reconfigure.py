"""A changed cluster or queue set: a node added, removed, cordoned or resized; a queue created, changed or
deleted. The engine's arrays are sized by the inventory and the queue tree, so such a change makes a new
engine; `successor` makes it keeping what the old one learned per queue (decayed usage and learned run times,
matched by queue name), so a weight change does not forget who used what.

Both drivers go through `successor`. The controller then re-derives what runs from its pod cache, the truth
on a cluster; the simulator has no other truth than the old engine and moves its workloads over with
`carry_over`, which does what the cluster does to them: pods keep running where their node still is (a
cordon does not evict), pods of a removed node are gone, work of a deleted queue is no longer fairgpu's to
account (running pods stay where they run, charged to nobody; waiting ones wait for their queue) until the
queue is back."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fairgpu.errors import RequestError, StateError
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model.node import NodeSpec
from fairgpu.model.pod import Workload
from fairgpu.model.queue import QueueTree
from fairgpu.state import Placement


def successor(old: Scheduler, nodes: list[NodeSpec], tree: QueueTree, now: float) -> Scheduler:
    """An empty engine for `nodes` and `tree` that inherits `old`'s per-queue memory at `now`."""
    new = Scheduler(nodes, tree, old.profile)
    same = [(i, old.tree.index[q.name]) for i, q in enumerate(tree.queues) if q.name in old.tree.index]
    new.accounting.inherit(old.accounting, same, now)
    new.durations.inherit(old.durations, same)
    return new


@dataclass(slots=True)
class Carried:
    """What did not move over as it was."""

    displaced: list[str] = field(default_factory=list)  # running workloads whose node is gone: no longer held
    # running, queue gone: held where they run, charged to nobody (workload, start time)
    pinned: dict[str, tuple[Workload, float]] = field(default_factory=dict)
    orphaned: list[Workload] = field(default_factory=list)  # waiting, queue gone or cannot be placed any more


def carry_over(old: Scheduler, new: Scheduler, pinned: dict[str, tuple[Workload, float]]) -> Carried:
    """Move `old`'s workloads into `new` (made by `successor`), in submission order so queues keep their
    order. `pinned`: workloads held outside any queue (an earlier carry's `pinned`), by name."""
    out = Carried()
    names = new.state.node_index

    def moved(ps: list[Placement]) -> list[Placement] | None:
        idx = [names.get(old.state.node_names[p.node]) for p in ps]
        return None if None in idx else [replace(p, node=i) for p, i in zip(ps, idx, strict=True) if i is not None]

    def pin(wl: Workload, ps: list[Placement], started: float) -> bool:
        for i, p in enumerate(ps):
            try:
                new.state.assign(wl.pod_names[i], p)
            except StateError:
                for k in wl.pod_names[:i]:
                    new.state.release(k)
                return False
        out.pinned[wl.name] = (wl, started)
        return True

    def move(wl: Workload, placements: list[Placement], started: float) -> None:
        ps = moved(placements)
        qi = new.tree.index.get(wl.queue)
        if ps is None:
            out.displaced.append(wl.name)
        elif qi is None or not new.tree.is_leaf[qi]:
            if not pin(wl, ps, started):
                out.displaced.append(wl.name)
        else:
            try:
                new.adopt(wl, ps, started)
            except StateError:  # its node shrank under it
                out.displaced.append(wl.name)

    for wl, started in pinned.values():  # back in the engine if their queue is
        move(wl, [p for k in wl.pod_names if (p := old.state.placement(k)) is not None], started)
    for entry in sorted(old.running.values(), key=lambda e: e.seq):
        n = len(entry.placed)
        assert entry.started is not None
        move(
            entry.workload if n == len(entry.workload.pods) else _first(entry.workload, n), entry.placed, entry.started
        )
    for entry in sorted(old.pending.values(), key=lambda e: e.seq):
        try:
            new.submit(entry.workload)
        except RequestError:
            out.orphaned.append(entry.workload)
    return out


def _first(wl: Workload, n: int) -> Workload:
    """An elastic workload as far as it has grown: it moves over at that size."""
    return replace(wl, pods=wl.pods[:n], pod_names=wl.pod_names[:n])
