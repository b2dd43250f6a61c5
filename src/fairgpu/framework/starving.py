"""Starving workloads: one that has waited its queue's `starvation_after` and still does not fit holds the
nodes that free soonest (reservations.py), one holder at a time; one ahead of the holder in a cycle's order
takes the hold over. What others may still do on held nodes (backfill) is reservations.py's and backfill.py's.
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
    __slots__ = ("durations", "preempting", "profile", "reservations", "running_ends", "tree", "view")

    def __init__(
        self,
        tree: QueueTree,
        profile: Profile,
        view: EngineView,
        reservations: Reservations,
        preempting: Preempting,
        durations: Durations,
        running_ends: Callable[[], list[tuple[float, list[str]]]],
    ) -> None:
        self.tree = tree
        self.profile = profile
        self.view = view
        self.reservations = reservations
        self.preempting = preempting
        self.durations = durations
        self.running_ends = running_ends

    def starving(self, entry: Entry, now: float) -> bool:
        return now - entry.workload.submit_time >= self.tree.queues[entry.queue].starvation_after

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
        starving = self.starving(entry, now)
        # One starving workload holds nodes at a time; one ahead of it in this cycle's order takes over.
        holder = self.reservations.starving_holder()
        if holder is not None and holder not in memo.attempted:
            del self.reservations[holder]
            holder = None
        if self.profile.reserve and starving and holder is None and not entry.placed:
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
