"""Preemption orchestration: for a workload that does not fit, ask the profile's Preempt plugins whom to
evict, mark the victims as leaving, and hold the room they make for it.

The plugins choose (plugins/preemption.py has the rules); this room keeps what they choose from and plan
in: the table of running work that could be evicted (rebuilt only when placements changed), usage as it
will be once evictions under way complete, and the room other preemptors of the same queue already
planned with, so two never count on the same free GPUs.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fairgpu import resources as r
from fairgpu.framework import placement as pl
from fairgpu.framework.accounting import ShareAccounting
from fairgpu.framework.engine import CycleResult, Entry, VictimRows
from fairgpu.framework.interfaces import EngineView, Evict, PreemptContext, Profile, VictimTable, VictimUnit
from fairgpu.framework.lookahead import StartPlan
from fairgpu.framework.reservations import Reservations
from fairgpu.model.queue import QueueTree
from fairgpu.state import ClusterState, Footprint, scratch_key


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
    ) -> None:
        self.state, self.tree, self.profile, self.accounting = state, tree, profile, accounting
        self.view = accounting.view
        self.running, self.pending, self.reservations = running, pending, reservations
        self.leaving = np.zeros((len(tree), len(r.FAIR_DIMS)))  # what evictions under way take from each queue
        self.max_grace = max((spec.preemption.grace_period for spec in tree.queues), default=0.0)
        self.refused: dict[str, float] = {}  # victims whose eviction was refused → when they may be tried again
        self.evicted_for: dict[str, str] = {}  # victim being evicted → the preemptor it makes room for
        self._version = 0  # bumped on every assign/release, so the cached victim table knows
        self._table_version = -1
        self._table: VictimTable | None = None
        self._index: dict[str, list[int]] = {}

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
        """Preempt for a workload that does not fit, unless its queue may not or its shape already failed to
        make room this cycle. True if victims are now being evicted for it."""
        shape = (entry.queue, entry.key)
        if entry.workload.name in self.reservations or shape in hopeless:
            return False
        may = self.profile.preempt and self.tree.queues[entry.queue].preemption.enabled
        result.searches += bool(may)
        if may and self._preempt(entry, now, result):
            return True
        hopeless.add(shape)
        return False

    def _preempt(self, entry: Entry, now: float, result: CycleResult) -> bool:
        wl = entry.workload
        rest = entry.rest
        charge = entry.charge - self.accounting.charge_of(wl.pods[: len(entry.placed)])
        # It starts only when its victims' grace has passed: plan around reservations it would then meet.
        usage = self._committed_usage()
        exclude = self.reservations.nodes_to_avoid(wl, entry.queue, now, now + self.max_grace, preempting=True)
        view = self._planned_view(entry)
        ctx = PreemptContext(wl, entry.queue, charge, rest, view, now, self.victims, self.profile, usage, exclude)
        for plugin in self.profile.preempt:
            chosen = plugin.preempt(ctx)
            if chosen is None or not len(chosen):
                continue
            at, nodes, table = now, set[int](), ctx.victims
            for i in chosen:
                unit = table.units[i]
                pods = None if unit.whole else unit.pods
                grace = self.evict(self.running[unit.workload.name], unit.charge, pods, wl.name, now, result)
                at = max(at, now + grace)
                nodes.update(p.node for p in unit.placements)
            # Hold every node its pods will need, not only the victims': free GPUs it counts on elsewhere
            # must not go to others while the victims leave.
            gone = np.zeros(len(table.units), dtype=bool)
            gone[chosen] = True
            keys = [scratch_key("reserve", i) for i in range(len(rest))]
            planned = tuple(pl.place_all(rest, keys, ctx.potential(gone), self.profile, exclude))
            nodes.update(p.node for p in planned)
            unit_ids = np.arange(len(gone))
            given = tuple((table.units[i].workload.name, table.footprint.select(unit_ids == i)) for i in chosen)
            self.reservations.hold(wl.name, entry.queue, StartPlan(at, frozenset(nodes)), False, planned, given)
            return True
        return False

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
        ids = self._index.get(victim.workload.name)
        if self._table is not None and ids:
            self._table.alive[ids] = False  # no longer a candidate victim
        result.evictions.append(
            Evict(victim.workload.name, reason or f"preempted for {for_whom}", now + grace, pods, grace)
        )
        return grace

    def _planned_view(self, entry: Entry) -> EngineView:
        """The cluster a preemptor plans in. Preemptors of one queue share the room eviction makes, so room
        another of them already planned with is taken: what its victims give up freed (while they are still
        leaving), its pods where they will go. Two of them never count on the same free GPUs (one would find
        its room gone, and preempt again)."""
        others = [
            res
            for name, res in self.reservations.items()
            if name != entry.workload.name and not res.starving and res.queue == entry.queue and res.planned
        ]
        if not others:
            return self.view
        leaving = [
            fp
            for res in others
            for victim, fp in res.victims
            if (held := self.running.get(victim)) is not None and held.terminating
        ]
        state = self.state.without(Footprint.union(leaving)) if leaving else self.state.copy()
        for res in others:
            for i, p in enumerate(res.planned):
                if state.fits(p):
                    state.assign(scratch_key("planned", res.workload, i), p)
        return replace(self.view, state=state)

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
        pod — as arrays; rebuilt only when what runs has changed since the last preemption decision, from
        per-workload rows that are recomputed only for workloads whose placements changed."""
        if any(at <= self.view.now for at in self.refused.values()):  # refusals past their back-off
            self.refused = {n: at for n, at in self.refused.items() if at > self.view.now}
            self._version += 1
        if self._table is not None and self._table_version == self._version:
            return self._table
        units: list[VictimUnit] = []
        index: dict[str, list[int]] = {}
        pod_rows: list[tuple[int, int, int, int]] = []
        slot_rows: list[tuple[int, int, int, int, int, int]] = []
        for e in self.running.values():
            if e.started is None:
                continue
            rows = self._rows(e)
            wl, n = e.workload, len(e.placed)
            u = len(units)
            index[wl.name] = [u]
            units.append(VictimUnit(wl, e.queue, e.started, tuple(range(n)), tuple(e.placed), rows.held, True))
            pod_rows += [(*row, u) for row in rows.pods]
            slot_rows += [(*row, u) for per_pod in rows.slots for row in per_pod]
            if n > wl.needed:  # elastic: the newest extra pod goes first (placed pods stay a prefix)
                u += 1
                index[wl.name].append(u)
                held = self.accounting.charge_of(wl.pods[n - 1 : n])
                units.append(VictimUnit(wl, e.queue, e.started, (n - 1,), (e.placed[-1],), held, False))
                pod_rows.append((*rows.pods[-1], u))
                slot_rows += [(*row, u) for row in rows.slots[-1]]
        table = VictimTable.of(units, len(r.FAIR_DIMS), Footprint.from_rows(pod_rows, slot_rows))
        for name, ids in index.items():
            if self.running[name].terminating or name in self.refused:
                table.alive[ids] = False
        self._table, self._index, self._table_version = table, index, self._version
        return table

    def _rows(self, e: Entry) -> VictimRows:
        if e.victim_rows is None or e.victim_rows.version != e.version:
            e.victim_rows = VictimRows(
                e.version,
                [(p.node, p.cpu_m, p.memory_mib) for p in e.placed],
                [
                    [
                        (p.node, s, c, m, p.mig[k] if p.mig else -1)
                        for k, (s, c, m) in enumerate(zip(p.slots, p.cores, p.mem_mib, strict=True))
                    ]
                    for p in e.placed
                ],
                self.accounting.charge_of(e.workload.pods[: len(e.placed)]),
            )
        return e.victim_rows
