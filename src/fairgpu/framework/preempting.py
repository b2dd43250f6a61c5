"""Preemption orchestration: for a workload that does not fit, ask the profile's Preempt plugins whom to
evict, mark the victims as leaving, and hold the room they make for it.

The plugins choose (plugins/preemption.py has the rules); this room keeps what they choose from and plan
in: the table of running work that could be evicted (rebuilt only when placements changed), usage as it
will be once evictions under way complete, and the room other preemptors of the same queue already
planned with, so two never count on the same free GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import numpy as np

from fairgpu import resources as r
from fairgpu.framework import placement as pl
from fairgpu.framework import victims
from fairgpu.framework.accounting import ShareAccounting
from fairgpu.framework.engine import CycleResult, Entry
from fairgpu.framework.interfaces import EngineView, Evict, PreemptContext, Profile, VictimTable
from fairgpu.framework.lookahead import Planned, StartPlan, replay
from fairgpu.framework.reservations import Reservations
from fairgpu.model.queue import QueueTree
from fairgpu.state import ClusterState, Footprint, scratch_key

_AHEAD_MAX = 64  # queue-mates a preemptor's unaided start is replayed behind: bounds the replay's cost


def share_evicting(tree: QueueTree, profile: Profile) -> QueueTree:
    """The queue tree the engine runs: where a Preempt plugin says every queue evicts for its fair share
    (Preemption's `fair_share`), each queue that may preempt at all does, as if its policy said so."""
    if not any(getattr(plugin, "fair_share", False) for plugin in profile.preempt):
        return tree
    on = [
        replace(q, preemption=replace(q.preemption, fair_share=True)) if q.preemption.enabled else q
        for q in tree.queues
    ]
    return QueueTree(on)


class Preempting:
    def __init__(
        self,
        state: ClusterState,
        tree: QueueTree,
        profile: Profile,
        accounting: ShareAccounting,
        running: dict[str, Entry],
        pending: dict[str, Entry],
        reservations: Reservations,
        ends: Callable[[], list[tuple[float, list[str]]]],
    ) -> None:
        self.state, self.tree, self.profile, self.accounting = state, tree, profile, accounting
        self.ends = ends  # (expected end, pod keys) of running work: Scheduler.running_ends
        self.view = accounting.view
        self.running, self.pending, self.reservations = running, pending, reservations
        self.leaving = np.zeros((len(tree), len(r.FAIR_DIMS)))  # what evictions under way take from each queue
        self.max_grace = max((spec.preemption.grace_period for spec in tree.queues), default=0.0)
        self.refused: dict[str, float] = {}  # victims whose eviction was refused → when they may be tried again
        self.evicted_for: dict[str, str] = {}  # victim being evicted → the preemptor it makes room for
        self._version = 0  # bumped on every assign/release, so the cached victim table knows
        self._table_version = -1
        self._table: VictimTable | None = None
        self._index: dict[str, int] = {}  # running workload → its first unit in the cached table

    def placements_changed(self) -> None:
        self._version += 1

    def forget(self, name: str) -> None:
        """The workload is gone: it is no longer a refused victim or one being evicted for someone."""
        self.refused.pop(name, None)
        self.evicted_for.pop(name, None)

    def stop_leaving(self, entry: Entry) -> None:
        """The workload no longer counts as leaving (it left, shrank, or its eviction was refused)."""
        if entry.terminating and entry.leaving is not None:
            for q in self.tree.paths_of[entry.queue]:
                self.leaving[q] -= entry.leaving
        entry.terminating, entry.leaving = False, None

    def eviction_refused(self, name: str, retry_at: float) -> None:
        """See Scheduler.eviction_refused."""
        entry = self.running.get(name)
        if entry is None:
            return
        self.stop_leaving(entry)
        self.refused[name] = retry_at
        preemptor = self.evicted_for.pop(name, "")
        held = self.reservations.get(preemptor)
        if held is not None and not held.starving:
            del self.reservations[preemptor]
        self._version += 1  # the cached victim table marks it as leaving: rebuild it

    def try_once(self, entry: Entry, now: float, result: CycleResult, hopeless: set[tuple[int, int]]) -> bool:
        """Preempt for a workload that does not fit, unless its queue may not, no Preempt plugin could find
        it a victim (checked before the search is set up), or its shape already failed to make room this
        cycle. True if victims are now being evicted for it."""
        shape = (entry.queue, entry.key)
        if entry.workload.name in self.reservations or shape in hopeless:
            return False
        charge = entry.charge - self.accounting.charge_of(entry.workload.pods[: len(entry.placed)])
        # Usage as the search would see it only adds what preemptors already made room for (_committed_usage).
        least = self.view.usage[entry.queue] - self.leaving[entry.queue]
        may = self.tree.queues[entry.queue].preemption.enabled and any(
            plugin.may_find(self.view, entry.queue, charge, least) for plugin in self.profile.preempt
        )
        result.searches += may
        if may and self._preempt(entry, charge, now, result):
            return True
        hopeless.add(shape)
        return False

    def _preempt(self, entry: Entry, charge: np.ndarray, now: float, result: CycleResult) -> bool:
        wl = entry.workload
        rest = entry.rest
        # It starts only when its victims' grace has passed: plan around reservations it would then meet.
        usage = self._committed_usage()
        exclude = self.reservations.nodes_to_avoid(wl, entry.queue, now, now + self.max_grace, preempting=True)
        with self._planned_view(entry) as view:

            def unaided() -> float:
                order = [*self._ahead(entry, usage), Planned(rest, None)]
                fit = replay(order, view, self.profile, now, self.ends(), exclude)
                return math.inf if fit is None else fit.at

            ctx = PreemptContext(
                wl,
                entry.queue,
                charge,
                rest,
                view,
                now,
                self.victims,
                self.profile,
                usage,
                exclude,
                unaided,
                lambda q, gpus: self._drained(q, gpus, now),
                self.reservations.durations.of,
            )
            for plugin in self.profile.preempt:
                chosen = plugin.preempt(ctx)
                if chosen is not None and len(chosen):
                    self._hold(entry, ctx, chosen, result)
                    return True
        return False

    def _drained(self, queue: int, gpus: float, now: float) -> float:
        """When the queue's running work, ending when expected and starting nothing new, holds at most `gpus`
        GPUs; inf if it never does (an end is unknown). Work being evicted already counts as gone."""
        ends = sorted(
            (
                math.inf if e.started is None or (d := self.reservations.durations.of(e.workload, queue)) is None
                else e.started + d,
                float(sum(c[r.DIM_GPU] for c in e.pod_charges[: len(e.placed)])),
            )
            for e in self.running.values()
            if e.queue == queue and not e.terminating
        )  # fmt: skip
        held = sum(g for _, g in ends)
        at = now
        for end, g in ends:
            if held <= gpus + 1e-9:
                break
            held, at = held - g, max(at, end)
        return at if held <= gpus + 1e-9 else math.inf

    def _ahead(self, entry: Entry, usage: np.ndarray) -> list[Planned]:
        """Its queue's pending work ahead of it with no room held, as far as the queue's fair share reaches:
        without eviction those start first, so its own wait (when a fair-share eviction is worth it) is the
        wait behind them. Judged alone, every job of a queue far below its share would see only the wait for
        the next GPU to free, and none would ever be worth an eviction."""
        q, gpu = entry.queue, r.DIM_GPU
        room = self.view.entitled_dom[q] * self.view.capacity[gpu] - usage[q, gpu] - entry.charge[gpu]
        ahead = sorted(
            (e for e in self.pending.values() if e.queue == q and e.order < entry.order and not e.placed),
            key=lambda e: e.order,
        )
        out: list[Planned] = []
        for e in ahead:
            if e.workload.name in self.reservations:
                continue
            room -= e.charge[gpu]
            if room < 0 or len(out) >= _AHEAD_MAX:
                break
            out.append(Planned(e.rest, self.reservations.durations.of(e.workload, q)))
        return out

    def _hold(self, entry: Entry, ctx: PreemptContext, chosen: np.ndarray, result: CycleResult) -> None:
        """Evict the chosen victims for the workload, and hold the room they make for it."""
        wl, now, table = entry.workload, ctx.now, ctx.victims
        gone = np.zeros(len(table.units), dtype=bool)
        gone[chosen] = True
        gone = table.once(gone)  # one eviction per workload: its extra pod goes with it, charged and freed once
        units = np.flatnonzero(gone).tolist()
        at, nodes = now, set[int]()
        for i in units:
            unit = table.units[i]
            pods = None if unit.whole else unit.pods
            grace = self.evict(self.running[unit.workload.name], unit.charge, pods, wl.name, now, result)
            at = max(at, now + grace)
            nodes.update(p.node for p in unit.placements)
        # Hold every node its pods will need, not only the victims': free GPUs it counts on elsewhere
        # must not go to others while the victims leave.
        keys = [scratch_key("reserve", i) for i in range(len(ctx.pods))]
        with ctx.dry_run(gone) as dry:
            planned = tuple(pl.place_all(ctx.pods, keys, dry, self.profile, ctx.exclude))
        nodes.update(p.node for p in planned)
        unit_ids = np.arange(len(gone))
        given = tuple((table.units[i].workload.name, table.footprint.select(unit_ids == i)) for i in units)
        self.reservations.hold(wl.name, entry.queue, StartPlan(at, frozenset(nodes)), False, planned, given)

    def evict(
        self,
        victim: Entry,
        charge: np.ndarray,
        pods: tuple[int, ...] | None,
        for_whom: str,
        now: float,
        result: CycleResult,
        reason: str = "",
    ) -> float:
        """Mark a running workload (or, with `pods`, an elastic one's extra pods) as leaving and decide its
        eviction to make room for `for_whom`; returns its grace period."""
        grace = self.tree.queues[victim.queue].preemption.grace_period
        victim.terminating = True
        victim.leaving = charge
        for q in self.tree.paths_of[victim.queue]:
            self.leaving[q] += charge
        self.evicted_for[victim.workload.name] = for_whom
        if self._table is not None:
            self._mark_gone(self._table, victim.workload.name)
        result.evictions.append(
            Evict(victim.workload.name, reason or f"preempted for {for_whom}", now + grace, pods, grace)
        )
        return grace

    @contextmanager
    def _planned_view(self, entry: Entry) -> Iterator[EngineView]:
        """The cluster a preemptor plans in, for the length of the block. Preemptors of one queue share the
        room eviction makes, so room another of them already planned with is taken: what its victims give
        up freed (while they are still leaving), its pods where they will go. Two of them never count on
        the same free GPUs (one would find its room gone, and preempt again)."""
        others = [
            res
            for name, res in self.reservations.items()
            if name != entry.workload.name and not res.starving and res.queue == entry.queue and res.planned
        ]
        if not others:
            yield self.view
            return
        leaving = [
            fp
            for res in others
            for victim, fp in res.victims
            if (held := self.running.get(victim)) is not None and held.terminating
        ]
        with self.state.dry_run(Footprint.union(leaving) if leaving else None) as state:
            for res in others:
                for i, p in enumerate(res.planned):
                    if state.fits(p):
                        state.assign(scratch_key("planned", res.workload, i), p)
            yield self.view

    def _committed_usage(self) -> np.ndarray:
        """(Q, R) usage as it will be once evictions under way complete: victims' leaving charge gone,
        and what preemptors already made room for counted as theirs."""
        usage = self.view.usage - self.leaving
        for name, res in self.reservations.items():
            e = self.pending.get(name)
            if not res.starving and e is not None:
                for q in self.tree.paths_of[e.queue]:
                    usage[q] += e.charge
        return usage

    def victims(self) -> VictimTable:
        """Running work that could be evicted — whole workloads, and each elastic workload's newest extra
        pod — as arrays (framework/victims.py); rebuilt only when what runs has changed since the last
        preemption decision."""
        if any(at <= self.view.now for at in self.refused.values()):  # refusals past their back-off
            self.refused = {n: at for n, at in self.refused.items() if at > self.view.now}
            self._version += 1
        if self._table is not None and self._table_version == self._version:
            return self._table
        entries = [e for e in self.running.values() if e.started is not None]
        table, first = victims.build(entries, self.accounting, len(r.FAIR_DIMS))
        self._index = dict(zip([e.workload.name for e in entries], first.tolist(), strict=True))
        for name in self.refused:
            self._mark_gone(table, name)
        self._table, self._table_version = table, self._version
        return table

    def _mark_gone(self, table: VictimTable, name: str) -> None:
        """The workload's units are no longer candidates (being evicted, or its eviction refused)."""
        u = self._index.get(name)
        if u is not None:
            table.alive[u] = False
            if u + 1 < len(table.whole) and not table.whole[u + 1]:
                table.alive[u + 1] = False  # its extra pods' unit
