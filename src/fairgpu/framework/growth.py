"""Elastic workloads growing: after every pending workload had its turn in a cycle, running workloads below
their full size (min_pods reached, more wanted) grow into what is left, the queue furthest below its share
first, one pod at a time, within their queue's admission and outside nodes held for others."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from fairgpu.framework import placement as pl
from fairgpu.framework.accounting import ShareAccounting
from fairgpu.framework.engine import CycleResult, Entry
from fairgpu.framework.interfaces import Bound, Profile
from fairgpu.framework.reservations import Reservations
from fairgpu.model.pod import PodSpec
from fairgpu.state import ClusterState


class Growth:
    __slots__ = ("accounting", "growable", "profile", "reservations", "running", "state")

    def __init__(
        self,
        state: ClusterState,
        profile: Profile,
        accounting: ShareAccounting,
        reservations: Reservations,
        running: dict[str, Entry],
    ) -> None:
        self.state = state
        self.profile = profile
        self.accounting = accounting
        self.reservations = reservations
        self.running = running
        self.growable: set[str] = set()  # running elastic workloads below their full size

    def steps(self, now: float, result: CycleResult, account: Callable[[Entry, PodSpec, int], None]) -> Iterator[None]:
        """Grow each growable workload as far as it fits (`account` charges each pod placed), one decision
        per workload."""
        view = self.accounting.view
        growing = [e for n in self.growable if not (e := self.running[n]).terminating]
        growing.sort(key=lambda e: (view.share_ratio[e.queue], e.order))
        for entry in growing:
            wl = entry.workload
            exclude = self.reservations.nodes_to_avoid(wl, entry.queue, now)
            while len(entry.placed) < len(wl.pods):
                i = len(entry.placed)
                pod = wl.pods[i]
                charge = self.accounting.charge(pod)
                if any(a.admit(wl, entry.queue, charge, view) for a in self.profile.admit):
                    break
                placement = pl.place_pod(pod, view, self.profile, exclude, key=wl.pod_names[i])
                if placement is None:
                    break
                self.state.assign(wl.pod_names[i], placement)
                entry.placed.append(placement)
                account(entry, pod, +1)
                entry.backfilled |= self.reservations.entered(wl, entry.queue, [placement.node])
                result.bound.append(Bound(wl.name, i, wl.pod_names[i], placement))
            if len(entry.placed) == len(wl.pods):
                self.growable.discard(wl.name)
            result.attempts += 1
            yield
