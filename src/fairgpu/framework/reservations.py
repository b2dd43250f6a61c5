"""Reservations: nodes held for one workload — one that starves, or one whose victims are being evicted —
that others may use only if they end before the holder is due to start."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairgpu.framework.lookahead import StartPlan
from fairgpu.model.pod import Workload
from fairgpu.state import Footprint, Placement


@dataclass(slots=True)
class Reservation:
    workload: str
    fit: StartPlan  # when it is due to start, and on which nodes
    exclude: np.ndarray  # (N,) bool: the held nodes
    starving: bool  # held for a starving workload; else for a preemptor while its victims leave
    queue: int
    planned: tuple[Placement, ...] = ()  # a preemptor's: where its pods go once its victims are gone
    victims: tuple[tuple[str, Footprint], ...] = ()  # a preemptor's: what each victim workload gives up


class Reservations(dict[str, Reservation]):
    """Reservations by the workload they hold nodes for."""

    __slots__ = ("num_nodes",)

    def __init__(self, num_nodes: int) -> None:
        super().__init__()
        self.num_nodes = num_nodes

    def hold(
        self,
        workload: str,
        queue: int,
        fit: StartPlan,
        starving: bool,
        planned: tuple[Placement, ...] = (),
        victims: tuple[tuple[str, Footprint], ...] = (),
    ) -> None:
        exclude = np.zeros(self.num_nodes, dtype=bool)
        exclude[list(fit.nodes)] = True
        self[workload] = Reservation(workload, fit, exclude, starving, queue, planned, victims)

    def starving_holder(self) -> str | None:
        """The workload holding nodes because it starves (one at a time), if any."""
        return next((name for name, res in self.items() if res.starving), None)

    def nodes_to_avoid(
        self, wl: Workload, queue: int, now: float, start: float | None = None, preempting: bool = False
    ) -> np.ndarray | None:
        """(N,) nodes this workload must avoid: reservations for others that it would still be running into
        if it started at `start` (default now); None when there are none. Room made by preemption is shared
        by that queue's preempting workloads (their victims are chosen together; `preempting`: it is
        choosing victims now), and held from everyone else.

        A reservation of another workload whose start time has passed without it starting is dropped here,
        when it is met: the holder looks again at its next attempt."""
        own = self.get(wl.name)
        preempting = preempting or (own is not None and not own.starving)
        exclude = None
        for name, res in list(self.items()):
            if name == wl.name or (preempting and (res.starving or res.queue == queue)):
                continue  # a preemptor keeps the room it planned with, even if a starving gang came later
            if now > res.fit.at:
                del self[name]
                continue
            d = wl.duration
            if d is None or (now if start is None else start) + d > res.fit.at:
                exclude = res.exclude if exclude is None else exclude | res.exclude
        return exclude
