"""Reservations: nodes held for one workload — one that starves, or one whose victims are being evicted —
that others may use only if they are expected to end before the holder is due to start (backfill; their own
duration, else their queue's learned estimate: durations.py). Backfill still running when its holder comes
due is evicted (Scheduler.cycle), so a wrong estimate never delays the holder past its planned start."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairgpu.framework.durations import Durations
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

    __slots__ = ("durations", "num_nodes")

    def __init__(self, num_nodes: int, durations: Durations) -> None:
        super().__init__()
        self.num_nodes = num_nodes
        self.durations = durations

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
        holding = own is not None and not own.starving
        exclude = None
        for name, res in list(self.items()):
            if _exempt(wl.name, queue, preempting or holding, name, res):
                continue
            if now > res.fit.at:
                del self[name]
                continue
            d = self.durations.of(wl, queue)
            if d is None or (now if start is None else start) + d > res.fit.at:
                held = _held(res, own if holding else None)
                exclude = held if exclude is None else exclude | held
        return exclude

    def entered(self, wl: Workload, queue: int, nodes: list[int]) -> frozenset[str]:
        """The reservations a workload just placed on `nodes` entered as backfill: those it had to avoid
        unless expected to end before they are due (not its own, nor those a preemptor may share)."""
        own = self.get(wl.name)
        holding = own is not None and not own.starving
        return frozenset(
            name
            for name, res in self.items()
            if not _exempt(wl.name, queue, holding, name, res) and _held(res, own if holding else None)[nodes].any()
        )

    def due(self, now: float) -> list[Reservation]:
        """Reservations whose holder is due to start by now."""
        return [res for res in self.values() if res.fit.at <= now]


def _exempt(wl: str, queue: int, preempting: bool, holder: str, res: Reservation) -> bool:
    """Whether a workload may use a reservation's nodes whatever its duration: its own, and for a preemptor,
    room its queue made by preemption. One choosing victims now plans around a starving holder's nodes like
    any other work: evicting the backfill there for work that runs past the holder's start would delay the
    holder beyond its bound."""
    return holder == wl or (preempting and res.queue == queue and not res.starving)


def _held(res: Reservation, own: Reservation | None) -> np.ndarray:
    """(N,) the nodes a reservation holds from a workload. A preemptor holding room (`own`, its victims are
    leaving) keeps the room it planned with even if a starving holder came later and counts on it; the
    starving holder's other nodes it may use only as backfill, like anyone (once its victims left, packing
    it there instead ran past the holder's start, and the holder lost its turn and drained all over)."""
    if own is None or not res.starving:
        return res.exclude
    held: np.ndarray = res.exclude & ~own.exclude
    return held
