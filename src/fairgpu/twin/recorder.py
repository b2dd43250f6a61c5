"""The recorder: turns what a driver sees, instant by instant, into trace records (twin/schema.py).

It diffs name sets between two instants (C-speed set operations, not a loop over every workload): a new name
is a `submit`, a name newly running a `start`, a name gone an `end` whose outcome is `evicted` when an
eviction was decided for it or a node it ran on is gone, `finished` when it ran, `withdrawn` when it never
started. An eviction decided and then refused (a PodDisruptionBudget) is a `refused` record. As a CycleObserver
(`EngineRecorder`) it sees every decision of the engine it is attached to, in either driver.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fairgpu.framework.interfaces import Evict
from fairgpu.framework.scheduler import CycleResult, Scheduler
from fairgpu.model import NodeSpec, QueueSpec, Workload
from fairgpu.twin.encode import header, node_doc, queue_doc, submit_record
from fairgpu.twin.writer import TraceWriter


@dataclass(slots=True)
class Seen:
    """What a driver saw at one instant."""

    nodes: Sequence[NodeSpec]
    queues: Sequence[QueueSpec]
    pending: Collection[str]
    running: Collection[str]
    workload: Callable[[str], Workload]  # a held workload as submitted
    placed_on: Callable[[str], list[str]]  # node of each placed pod of a running workload
    started_at: Callable[[str], float]  # when a running workload started
    evictions: Sequence[Evict] = ()  # decided at this instant
    # How long the pods of a workload that stopped ran, where the driver can tell (the controller: from the
    # kubelet's start to the pods' exit); else a run lasts from its start to its end record.
    ran: Callable[[Sequence[str]], float | None] | None = None
    deleted: Collection[str] = ()  # gone while running because their pods were deleted, not because they exited
    refused: Mapping[str, float] = field(default_factory=dict)  # evictions refused: workload → retry time


class Recorder:
    def __init__(self, writer: TraceWriter, source: str, scheduler: str = "fairgpu", profile: str = "") -> None:
        self.writer = writer
        self.meta = (source, scheduler, profile)
        self.epoch: float | None = None
        self._inputs: tuple[object, object] = (None, None)  # the node and queue lists last looked at
        self._node_docs: list[dict[str, Any]] = []
        self._queue_docs: list[dict[str, Any]] = []
        self._pending: set[str] = set()
        self._running: set[str] = set()
        self._evicting: set[str] = set()
        self._submits: dict[str, dict[str, Any]] = {}  # the submit record of each held workload
        self._began: dict[str, float] = {}  # start time (trace seconds) of each running workload
        self._where: dict[str, list[str]] = {}  # the nodes each running workload started on

    def observe(self, now: float, seen: Seen) -> None:
        out: list[dict[str, Any]] = []
        if self.epoch is None:
            self.epoch = now
            out.append(header(now, *self.meta))
            self.writer.mark_snapshot()
        t = now - self.epoch
        out += self._inputs_changed(t, seen)
        pending, running = set(seen.pending), set(seen.running)
        held = pending | running
        was_running = self._running
        gone = (self._pending | was_running) - held
        nodes = {n.name for n in seen.nodes} if was_running - running else set()
        queues = {q.name for q in seen.queues} if gone else set()
        # Gone, or back to pending (evicted and resubmitted under the same name between two instants).
        for name in sorted(gone | (was_running & pending)):
            ran = name in was_running
            lost = ran and not nodes.issuperset(self._where.get(name, ()))  # its node is gone: so are its pods
            evicted = name in self._evicting or name in seen.deleted or lost
            # Its queue was deleted: no longer the engine's, its pods stay (and come back with the queue).
            orphaned = name in gone and self._submits[name]["queue"] not in queues
            outcome = "evicted" if evicted else "withdrawn" if orphaned or not ran else "finished"
            end: dict[str, Any] = {"kind": "end", "t": t, "workload": name, "outcome": outcome}
            length = seen.ran(self._submits[name]["pod_names"]) if seen.ran is not None and ran else None
            if length is not None:
                end["ran"] = length
            out.append(end)
            self._forget(name)
        new = held - self._pending - self._running
        # In the driver's order (those started at once, then those waiting): the replay breaks FIFO ties by it.
        for name in [n for n in (*seen.running, *seen.pending) if n in new] if new else ():
            rec = submit_record(t, seen.workload(name), self.epoch)
            self._submits[name] = rec
            self._pending.add(name)
            out.append(rec)
        for name in sorted(running - self._running):
            out.append(self._start(t, name, seen))
        self._pending -= running
        for name in sorted(self._evicting & running & seen.refused.keys()):
            self._evicting.discard(name)  # it runs on; the engine tries it again as a victim from `retry`
            out.append({"kind": "refused", "t": t, "workload": name, "retry": seen.refused[name] - self.epoch})
        for ev in seen.evictions:
            evict: dict[str, Any] = {"kind": "evict", "t": t, "workload": ev.workload, "reason": ev.reason}
            evict |= {"grace": ev.grace} if ev.grace else {}
            if ev.pods is not None:
                evict["pods"] = list(ev.pods)
            else:
                self._evicting.add(ev.workload)
            out.append(evict)
        self.writer.write(out)
        if self.writer.full():
            self._rotate(t)

    def _start(self, t: float, name: str, seen: Seen) -> dict[str, Any]:
        assert self.epoch is not None
        began = seen.started_at(name) - self.epoch
        rec: dict[str, Any] = {"kind": "start", "t": t, "workload": name, "nodes": seen.placed_on(name)}
        if began < t - 1e-6:  # found running (adopted): it started before this instant
            rec["began"] = began
        self._began[name] = min(began, t)
        self._where[name] = rec["nodes"]
        self._running.add(name)
        return rec

    def _forget(self, name: str) -> None:
        self._pending.discard(name)
        self._running.discard(name)
        self._evicting.discard(name)
        self._submits.pop(name, None)
        self._began.pop(name, None)
        self._where.pop(name, None)

    def _inputs_changed(self, t: float, seen: Seen) -> list[dict[str, Any]]:
        """Node and queue snapshots when they differ from the last written (looked at only when the driver
        hands over other lists: the engine keeps its lists until it is rebuilt)."""
        if seen.nodes is self._inputs[0] and seen.queues is self._inputs[1]:
            return []
        self._inputs = (seen.nodes, seen.queues)
        out = []
        nodes = [node_doc(n) for n in seen.nodes]
        if nodes != self._node_docs:
            self._node_docs = nodes
            out.append({"kind": "nodes", "t": t, "nodes": nodes})
        queues = [queue_doc(q) for q in seen.queues]
        if queues != self._queue_docs:
            self._queue_docs = queues
            out.append({"kind": "queues", "t": t, "queues": queues})
        return out

    def _rotate(self, t: float) -> None:
        """A new file that replays on its own: header, inventory, queues, and every workload still held."""
        assert self.epoch is not None
        self.writer.rotate()
        out = [header(self.epoch, *self.meta)]
        out.append({"kind": "nodes", "t": t, "nodes": self._node_docs})
        out.append({"kind": "queues", "t": t, "queues": self._queue_docs})
        for name in sorted(self._submits):
            out.append({**self._submits[name], "t": t})
            if name in self._running:
                start = {"kind": "start", "t": t, "workload": name, "nodes": self._where[name]}
                out.append(start | {"began": self._began[name]})
            if name in self._evicting:
                out.append({"kind": "evict", "t": t, "workload": name, "reason": "decided before this file"})
        self.writer.write(out)
        self.writer.mark_snapshot()

    def close(self) -> None:
        self.writer.close()


class EngineRecorder:
    """A CycleObserver that records what the engine it observes holds and decides."""

    def __init__(self, recorder: Recorder, ran: Callable[[Sequence[str]], float | None] | None = None) -> None:
        self.recorder = recorder
        self.ran = ran

    def on_cycle(self, sched: Scheduler, result: CycleResult, now: float, seconds: float) -> None:
        def placed_on(name: str) -> list[str]:
            return [sched.state.node_names[p.node] for p in sched.status(name).placements]

        def started_at(name: str) -> float:
            started = sched.status(name).started
            return now if started is None else started

        pending, running = sched.names()
        seen = Seen(sched.state.nodes, sched.tree.queues, pending, running, sched.workload, placed_on, started_at)
        seen.evictions, seen.ran, seen.refused = result.evictions, self.ran, sched.refused_evictions()
        self.recorder.observe(now, seen)
