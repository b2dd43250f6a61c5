"""Starving workloads: one that has waited its queue's `starvation_after` (or, with FairShare's `borrowed:
soonest-end`, whose queue is owed its share by a borrower) and still does not fit holds the nodes that free
soonest (reservations.py), one holder at a time; one ahead of the holder in a cycle's order takes the hold
over. What others may still do on held nodes (backfill) is reservations.py's and backfill.py's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fairgpu.framework.durations import Durations
from fairgpu.framework.engine import CycleMemo, CycleResult, Entry
from fairgpu.framework.interfaces import EngineView, Profile
from fairgpu.framework.lookahead import Planned, replay
from fairgpu.framework.preempting import Preempting
from fairgpu.framework.reservations import Reservations
from fairgpu.model.queue import QueueTree


class Starving:
    __slots__ = ("_never", "durations", "owes", "preempting", "profile", "reservations", "running_ends", "tree", "view")

    def __init__(
        self,
        tree: QueueTree,
        profile: Profile,
        view: EngineView,
        reservations: Reservations,
        preempting: Preempting,
        durations: Durations,
        running_ends: Callable[[], list[tuple[float, list[str]]]],
        owes: bool = False,
    ) -> None:
        self.tree = tree
        self.profile = profile
        self.view = view
        self.reservations = reservations
        self.preempting = preempting
        self.durations = durations
        self.running_ends = running_ends
        self.owes = owes  # holds for queues owed their share (with FairShare's `borrowed: soonest-end`)
        # (queue, shape) whose owed plan found no start, and the (cluster version, holds) they were planned in
        self._never: tuple[set[tuple[int, int]], tuple[int, tuple[str, ...]]] = (set(), (-1, ()))

    def starving(self, entry: Entry, now: float) -> bool:
        return self.waited(entry, now) or self.owed(entry)

    def waited(self, entry: Entry, now: float) -> bool:
        return now - entry.workload.submit_time >= self.tree.queues[entry.queue].starvation_after

    def owed(self, entry: Entry) -> bool:
        """It fits in what its queue is entitled to beyond what it holds, while another queue holds more than
        its own share. Then the room the borrower frees is the owner's at once; otherwise the borrower refills
        each GPU as it frees, and a pod that needs several on one node waits until it starves (demo:
        training's 2-GPU pods sat out research's borrowed GPUs going back to batch one by one). Only where
        borrowed capacity goes to the work that ends soonest (`owes`): borrowed work of any length (fifo)
        frees its nodes no sooner for being held, and there the holds changed nothing on the scenarios and
        made the Philly replay a little less fair (docs/performance.md). A queue whose policy evicts for its
        fair share, or work within a guarantee its queue reclaims, takes it back by eviction instead (its
        preemptors hold the room they make, and a hold of its own would keep them off it)."""
        if not self.owes:
            return False
        q, v = entry.queue, self.view
        if self.tree.takes_share_back(q, v.usage[q], entry.charge):
            return False
        if v.usage_dom[q] + entry.share > v.entitled_dom[q] + 1e-9:
            return False
        over = (v.usage_dom > v.entitled_dom + 1e-9) & v.tree.is_leaf
        over[q] = False
        return bool(over.any())

    def take_over(
        self, entry: Entry, now: float, memo: CycleMemo, place: Callable[[Entry, np.ndarray | None], bool]
    ) -> bool:
        """A starving workload ahead of the starving holder in this cycle's order takes the hold over (see
        on_unschedulable). Where the held room fits it now (the holder was due), it starts there at once
        (`place` puts it, outside the nodes still held): holding that room for itself instead would leave it
        idle until the next cycle. Otherwise the hold stays with its holder here, and on_unschedulable
        decides after preemption had its say."""
        holder = self.reservations.starving_holder()
        if not self.profile.reserve or holder is None or holder in memo.attempted or entry.placed:
            return False
        if not self.starving(entry, now):
            return False
        held = self.reservations.pop(holder)
        if place(entry, self.reservations.nodes_to_avoid(entry.workload, entry.queue, now)):
            return True
        if not entry.placed:  # pods a profile without a gang permit kept may be on those nodes: keep it taken
            self.reservations[holder] = held
        return False

    def on_unschedulable(self, entry: Entry, now: float, result: CycleResult, memo: CycleMemo) -> None:
        """A workload that is next in order does not fit: preempt for it if its queue's policy allows,
        else reserve the soonest-freeing nodes if it starves."""
        wl = entry.workload
        if wl.name in self.reservations or self.preempting.try_once(entry, now, result, memo.hopeless):
            return  # holding nodes (its victims are leaving, or it waits for them to free), or now will
        # One starving workload holds nodes at a time; one ahead of it in this cycle's order takes over.
        holder = self.reservations.starving_holder()
        if holder is not None and holder not in memo.attempted:
            del self.reservations[holder]
            holder = None
        if not self.profile.reserve or holder is not None or entry.placed:
            return
        waited = self.waited(entry, now)
        if not waited and not self._may_plan_owed(entry, memo):
            return
        held = self.reservations.nodes_to_avoid(wl, entry.queue, now)
        fit = replay(
            [Planned(wl.pods, self.durations.of(wl, entry.queue))],
            self.view,
            self.profile,
            now,
            self.running_ends(),
            held,
        )
        if fit is not None:
            self.reservations.hold(wl.name, entry.queue, fit, starving=True)
        elif not waited:
            self._never[0].add((entry.queue, entry.key))

    def _may_plan_owed(self, entry: Entry, memo: CycleMemo) -> bool:
        """Whether to plan an owed workload's hold now: at most one plan a cycle (a plan copies the cluster
        and lists every running workload's end, so one per failed shape of every queue under its share cost
        the engine 7x its speed at 5,000 nodes), and none for a (queue, shape) whose plan found no start
        while the cluster and its holds stayed as they were (it would find none again). The first owed
        workload in the cycle's order is the most owed queue's: the one a borrower's freed room should go
        to first."""
        if memo.owed_planned or not self.owed(entry):
            return False
        seen = (self.view.state.version, tuple(self.reservations))
        if self._never[1] != seen:
            self._never = (set(), seen)
        if (entry.queue, entry.key) in self._never[0]:
            return False
        memo.owed_planned = True
        return True
