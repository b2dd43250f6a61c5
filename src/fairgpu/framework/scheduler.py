"""The engine: pending workloads per queue, and the scheduling cycle that drives the plugins.

Pure and synchronous: drivers (the simulator, the Kubernetes controller) call submit/remove/cycle with
timestamps and carry out the decisions `cycle` returns. Its rooms: share accounting (accounting.py),
preemption orchestration (preempting.py), reservations (reservations.py, starving.py), lent capacity
(lending.py), elastic growth (growth.py), explanations (explain.py).

The cycle, as a story: refresh every queue's fair share; then, until no queue has anything left to try,
the QueueSort picks a queue, the queue offers its next workload, Admit plugins may refuse it, the
placement (Filter + Score) puts its pods, and Permit plugins keep or roll back a partial gang. A workload
that does not fit may preempt (preempting.py) or, when it starves, reserve the nodes that free soonest
(starving.py). Last, elastic workloads grow into what is left (growth.py).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, KeysView, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

import numpy as np

from fairgpu.errors import RequestError, StateError
from fairgpu.framework import placement as pl
from fairgpu.framework.accounting import ShareAccounting
from fairgpu.framework.backfill import settle_due
from fairgpu.framework.backlog import Backlog
from fairgpu.framework.durations import Durations
from fairgpu.framework.engine import CycleMemo, CycleResult, Entry
from fairgpu.framework.explain import Explanation, explain
from fairgpu.framework.growth import Growth
from fairgpu.framework.idle import idle_gpus
from fairgpu.framework.interfaces import ActiveQueues, Bound, Profile
from fairgpu.framework.lending import Lending, OverShareHold
from fairgpu.framework.preempting import Preempting, share_evicting
from fairgpu.framework.reservations import Reservations
from fairgpu.framework.starving import Starving
from fairgpu.framework.status import WorkloadStatus, status_of
from fairgpu.model.node import NodeSpec
from fairgpu.model.pod import Workload
from fairgpu.model.queue import QueueTree
from fairgpu.state import ClusterState, Placement

__all__ = ["CycleObserver", "CycleResult", "Scheduler", "WorkloadStatus"]


class CycleObserver(Protocol):
    """What a driver tells about every cycle, with its wall-clock cost (the engine itself reads no clock):
    observe.metrics.SchedulingMetrics feeds Prometheus counters from it, in both drivers."""

    def on_cycle(self, sched: Scheduler, result: CycleResult, now: float, seconds: float) -> None: ...


class Scheduler:
    def __init__(self, nodes: list[NodeSpec], tree: QueueTree, profile: Profile) -> None:
        self.state = ClusterState(nodes)
        self.tree = tree = share_evicting(tree, profile)
        self.profile = copy.deepcopy(profile)  # plugins may learn (e.g. the pod mix): one engine, one copy
        self.accounting = ShareAccounting(self.state, tree)
        self.view = self.accounting.view
        honour = profile.queue_sort.within_queue == "queue"
        # Borrowed capacity in its own order (lending.py): only where queues offer their own order
        lend = honour and getattr(profile.queue_sort, "borrowed", "fifo") == "soonest-end"
        self.lending = Lending(self.accounting, len(tree), lend)
        hold = getattr(profile.queue_sort, "long_over_share", "start") == "hold"
        self.over_share = OverShareHold(tree, self.view, hold)
        self.backlogs: list[Backlog[Entry]] = [
            Backlog(by_user=honour and spec.fair_within == "users", lends=lend) for spec in tree.queues
        ]
        # live attempt-key ids per queue, with how many pending workloads have each (plain dicts: a Counter's
        # missing keys and deletions go through Python methods, on every attempt)
        self._keys: list[dict[int, int]] = [{} for _ in tree.queues]
        self._key_ids: dict[tuple[object, ...], int] = {}  # attempt key (pod shapes) → small int, cheap to hash
        self.pending: dict[str, Entry] = {}
        self.running: dict[str, Entry] = {}
        self._seq = 0
        self.durations = Durations(len(tree))  # expected run times: given, else learned per queue
        self.reservations = Reservations(self.state.num_nodes, self.durations)
        self.preempting = Preempting(
            self.state,
            tree,
            self.profile,
            self.accounting,
            self.running,
            self.pending,
            self.reservations,
            self.running_ends,
        )
        self.growth = Growth(self.state, self.profile, self.accounting, self.reservations, self.running)
        self.held_back: frozenset[tuple[int, int]] = frozenset()  # last cycle's (queue, shape) (idle.py)
        self.starving = Starving(
            tree,
            self.profile,
            self.view,
            self.reservations,
            self.preempting,
            self.durations,
            self.running_ends,
            owes=lend,
        )

    # -- events from the driver ---------------------------------------------------------------------
    def submit(self, wl: Workload) -> None:
        """Queue a workload. Raises RequestError (nothing changed) if it can never be placed."""
        entry = self._entry(wl)
        for pod in wl.pods:
            problem = self.state.unplaceable_reason(pod)
            if problem:
                raise RequestError(f"workload {wl.name}: {problem}")
        self._seq += 1
        entry.key = self._attempt_key(entry)
        self.pending[wl.name] = entry
        self.backlogs[entry.queue].push(entry)
        keys = self._keys[entry.queue]
        keys[entry.key] = keys.get(entry.key, 0) + 1
        self.view.demand[entry.queue] += entry.charge

    def adopt(self, wl: Workload, placements: Sequence[Placement], started: float) -> None:
        """A workload found running where `placements` say (after a restart, or a rebuild of the engine): it
        is charged to its queue and may be preempted like one this engine placed. Raises RequestError for a
        queue it cannot be in, StateError if the placements do not fit; either way nothing changed."""
        entry = self._entry(wl)
        if len(placements) != len(wl.pods):
            raise RequestError(f"workload {wl.name}: {len(wl.pods)} pods but {len(placements)} placements")
        for i, p in enumerate(placements):
            try:
                self.state.assign(wl.pod_names[i], p)
            except StateError:
                for j in range(i):
                    self.state.release(wl.pod_names[j])
                raise
        self._seq += 1
        entry.started = started
        self.running[wl.name] = entry
        self.view.demand[entry.queue] += entry.charge
        entry.placed.extend(placements)
        self._account(entry, entry.pod_charges, +1)

    def _entry(self, wl: Workload) -> Entry:
        """A new entry for a workload of a leaf queue, not yet registered anywhere."""
        if wl.name in self.pending or wl.name in self.running:
            raise RequestError(f"workload {wl.name}: already submitted")
        qi = self.tree.index.get(wl.queue)
        if qi is None:
            raise RequestError(f"workload {wl.name}: queue {wl.queue!r} does not exist")
        if not self.tree.is_leaf[qi]:
            raise RequestError(f"workload {wl.name}: queue {wl.queue!r} has child queues; submit to a leaf")
        charge = self.accounting.charge_of(wl.pods)
        entry = Entry(wl, qi, self._seq, charge, self.accounting.dominant(charge))
        entry.pod_charges = tuple(self.accounting.charge(pod) for pod in wl.pods)
        entry.order = (-wl.priority, wl.submit_time, self._seq)
        run = math.inf if wl.duration is None else wl.duration  # declared only: a learned estimate changes
        entry.lend_order = (-wl.priority, wl.submit_time + run, wl.submit_time, self._seq)
        return entry

    def remove(self, name: str, finished_at: float | None = None) -> list[Placement]:
        """A workload finished or was deleted: release whatever it holds. Returns the released placements.
        `finished_at`: it ran to completion then (not evicted, not deleted early), so its run time teaches
        its queue's duration estimate."""
        self.growth.growable.discard(name)
        self.preempting.forget(name)
        entry = self.running.pop(name, None)
        if entry is not None and entry.started is not None and finished_at is not None:
            self.durations.finished(entry.queue, finished_at - entry.started)
        if entry is None:
            entry = self.pending.pop(name, None)
            if entry is None:
                raise KeyError(name)
            self.backlogs[entry.queue].remove(entry)
            self._forget_key(entry)
        self.preempting.stop_leaving(entry)
        released = [self._release(entry, i) for i in range(len(entry.placed))]
        entry.placed.clear()
        self.view.demand[entry.queue] -= entry.charge
        self.reservations.pop(name, None)
        return released

    def shrink(self, name: str, pods: tuple[int, ...], regrow: bool = True) -> list[Placement]:
        """An elastic workload's extra pods were evicted: release them. They can grow back later, unless
        `regrow` is False: then they are gone for good (a cluster deleted them; replacements arrive as new
        work) and the workload keeps only the pods it still runs."""
        entry = self.running[name]
        n = len(entry.placed)
        if sorted(pods) != list(range(n - len(pods), n)) or n - len(pods) < entry.workload.needed:
            raise ValueError(f"workload {name}: only its newest pods above min_pods can be shrunk")
        released = []
        for _ in pods:  # placed pods stay a prefix: the newest go first
            released.append(self._release(entry, len(entry.placed) - 1))
            entry.placed.pop()
        self.preempting.stop_leaving(entry)
        self.preempting.evicted_for.pop(name, None)
        if regrow:
            self.growth.growable.add(name)
        else:
            self._truncate(entry)
        return released

    def _truncate(self, entry: Entry) -> None:
        """The workload becomes the pods it has placed: its size, charge and demand shrink to them."""
        wl, n = entry.workload, len(entry.placed)
        charge = self.accounting.charge_of(wl.pods[:n])
        self.view.demand[entry.queue] += charge - entry.charge
        entry.workload = replace(wl, pods=wl.pods[:n], pod_names=wl.pod_names[:n])
        entry.pod_charges = entry.pod_charges[:n]
        entry.charge = charge
        entry.share = self.accounting.dominant(charge)
        self.growth.growable.discard(wl.name)

    def eviction_refused(self, name: str, retry_at: float) -> None:
        """The driver could not evict a victim (a PodDisruptionBudget said no): it keeps running, stops
        counting as leaving, and is not chosen as a victim again before `retry_at`. The preemptor it was
        to make room for loses the room it planned with, so its next attempt picks another victim."""
        self.preempting.eviction_refused(name, retry_at)

    # -- what drivers and the dashboard may read ----------------------------------------------------
    def refused_evictions(self) -> Mapping[str, float]:
        """Running workloads whose eviction was refused → when they may be chosen as victims again."""
        return self.preempting.refused

    def status(self, name: str) -> WorkloadStatus:
        """One workload's state. Raises KeyError for a workload the engine does not hold."""
        return status_of(self.running.get(name) or self.pending[name])

    def workloads(self, state: str | None = None, queue: str | None = None) -> list[WorkloadStatus]:
        """Workloads the engine holds, in submission order; `state` (pending | running) and `queue` narrow."""
        held = [
            e
            for e in (*self.pending.values(), *self.running.values())
            if (queue is None or e.workload.queue == queue)
            and (state is None or (e.started is not None) == (state == "running"))
        ]
        return [status_of(e) for e in sorted(held, key=lambda e: e.seq)]

    def workload(self, name: str) -> Workload:
        """A held workload as submitted (or as shrunk for good). Raises KeyError for one it does not hold."""
        return (self.running.get(name) or self.pending[name]).workload

    def names(self) -> tuple[KeysView[str], KeysView[str]]:
        """(pending, running) workload names: live views, cheap to diff between cycles (a recorder does)."""
        return self.pending.keys(), self.running.keys()

    def state_of(self, name: str) -> str | None:
        """pending, running, or None for a workload the engine does not hold."""
        return "running" if name in self.running else "pending" if name in self.pending else None

    def workload_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(Q,) pending and (Q,) running workloads of each leaf queue."""
        pending = np.zeros(len(self.tree), dtype=np.int64)
        running = np.zeros(len(self.tree), dtype=np.int64)
        np.add.at(pending, [e.queue for e in self.pending.values()], 1)
        np.add.at(running, [e.queue for e in self.running.values()], 1)
        return pending, running

    def is_backlogged(self) -> np.ndarray:
        """(Q,) whether each queue has pending workloads."""
        return np.array([len(b) > 0 for b in self.backlogs], dtype=bool)

    def refresh_shares(self, now: float) -> None:
        """Decay usage history to `now` and recompute entitlements and every queue's share ratio."""
        self.accounting.refresh(now)

    def running_ends(self) -> list[tuple[float, list[str]]]:
        """(expected end, pod keys) of every placed workload, running or partly placed. Its own duration, else
        its queue's current estimate, counts from its start."""
        out = [(self._expected_end(e), list(e.workload.pod_names[: len(e.placed)])) for e in self.running.values()]
        out += [(math.inf, list(e.workload.pod_names[: len(e.placed)])) for e in self.pending.values() if e.placed]
        return [(t, keys) for t, keys in out if math.isfinite(t)]

    def _expected_end(self, e: Entry) -> float:
        d = self.durations.of(e.workload, e.queue)
        return math.inf if e.started is None or d is None else e.started + d

    def idle_gpus(self, now: float) -> dict[str, float]:
        """Idle GPU-equivalents by cause (framework/idle.py): they sum to the cluster's idle GPUs."""
        return idle_gpus(self, now)

    def explain(self, name: str, now: float) -> Explanation:
        """Why a workload is pending, its place in its queue and in the cluster, and its estimated start."""
        return explain(self, name, now)

    def admission_refusal(self, entry: Entry) -> str | None:
        """Why the profile's Admit plugins refuse the rest of this workload now; None if they admit it."""
        remaining = entry.charge
        if entry.placed:  # a gang retried with some pods placed: what is left of it
            remaining = remaining - self.accounting.charge_of(entry.workload.pods[: len(entry.placed)])
        for plugin in self.profile.admit:
            reason = plugin.admit(entry.workload, entry.queue, remaining, self.view)
            if reason is not None:
                return reason
        return None

    # -- the scheduling cycle -----------------------------------------------------------------------
    def cycle(self, now: float) -> CycleResult:
        """Place what fits, in the profile's order; an unschedulable workload never blocks those behind it."""
        result = CycleResult()
        for _ in self.steps(now, result):
            pass
        return result

    def steps(self, now: float, result: CycleResult) -> Iterator[None]:
        """The cycle one attempt at a time (decisions accumulate in `result`), so a driver can time each
        decision or stop early; closing the generator early leaves every unattempted workload pending."""
        self.view.now = now
        self.refresh_shares(now)
        settle_due(self.reservations, self.running, self.pending, self.preempting, now, result)
        memo = CycleMemo.of(len(self.backlogs))
        backlogs = self.backlogs
        # Each queue's head, looked up once: an attempt changes only its own queue's (it pops it, and its
        # placements change what its users hold), so only that one is forgotten after it.
        heads: dict[int, Workload] = {}

        def head(q: int) -> Workload:
            wl = heads.get(q)
            if wl is None:
                wl = heads[q] = backlogs[q].peek().workload
            return wl

        active = ActiveQueues(self.tree, [q for q, b in enumerate(backlogs) if b], head)
        try:
            while active:
                q = self.profile.queue_sort.pick(active, self.view)
                heads.pop(q, None)
                lend = self.lending.lends(q)
                entry = self.backlogs[q].pop(lend)
                if not entry.placed:  # pods it holds were counted by what it was when they were placed
                    entry.lent = lend
                memo.attempted.add(entry.workload.name)
                exclude = (
                    self.reservations.nodes_to_avoid(entry.workload, entry.queue, now) if self.reservations else None
                )
                # Kept out of reserved nodes, a workload fits in less: its failures are cached apart, by
                # duration (a shorter one of the same shape may still backfill; CycleMemo.fails_outside).
                duration = self.durations.of(entry.workload, entry.queue)
                outside = exclude is not None
                if entry.key in memo.refused[q]:
                    memo.skip(q, entry)
                elif entry.key in memo.failed or (outside and memo.fails_outside(entry.key, duration)):
                    memo.skip(q, entry)  # does not fit: it may still make room by preemption
                    memo.backfill_skips[q] += outside
                    self.preempting.try_once(entry, now, result, memo.hopeless)
                elif self.over_share.on and self._held_back(entry, duration, memo):
                    memo.skip(q, entry)
                elif self.admission_refusal(entry) is not None:
                    memo.refused[q].add(entry.key)
                    memo.skip(q, entry)
                elif self._try_place(entry, result, exclude) or (
                    outside and self.starving.take_over(entry, now, memo, lambda e, x: self._try_place(e, result, x))
                ):
                    self._start(entry, result, now)
                else:
                    if outside:
                        memo.failed_outside_for(entry.key, duration)
                    else:
                        memo.failed.add(entry.key)
                    memo.skip(q, entry)
                    self.starving.on_unschedulable(entry, now, result, memo)
                if not self.backlogs[q] or memo.queue_done(q, self._keys[q].keys()):
                    active.remove(q)
                result.attempts += 1
                yield
            yield from self.growth.steps(
                now, result, lambda e, pod, sign: self._account(e, (self.accounting.charge(pod),), sign)
            )
        finally:
            for q, entries in memo.skipped.items():
                for entry in entries:
                    self.backlogs[q].push(entry)
            self.held_back = frozenset(memo.held)

    def _held_back(self, entry: Entry, duration: float | None, memo: CycleMemo) -> bool:
        """OverShareHold's rule, once per queue and shape a cycle (CycleMemo.held)."""
        if duration is None and not memo.held:
            return False  # OverShareHold holds back only work of a known run time, and none was held back yet
        q, holder = entry.queue, self.reservations.starving_holder()
        if holder == entry.workload.name:
            return False  # the engine's bound against starvation: held back, its reserved room would idle
        if memo.held_back(q, entry.key, duration):
            return True

        # A queue waits for room once work of its fitted nowhere this cycle: other work kept only off reserved
        # nodes waits for their holder, and one not yet tried may take the room itself (holding back for either
        # only idled GPUs within the cycle on batch-monopoly, docs/performance.md). A gang kept off them waits
        # for room too: its pods must find it together, outside the held nodes, and an over-share long start
        # takes what it is gathering (Philly: fairer or as fair at every size measured).
        def waits(k: int) -> bool:
            return any(
                e.key in memo.failed or (e.workload.needed > 1 and e.key in memo.failed_outside)
                for e in memo.skipped.get(k, ())
            )

        held = self.pending.get(holder) if holder else None
        if not self.over_share.holds_back(entry, duration, waits, held.queue if held else None):
            return False
        memo.hold_back(q, entry.key, duration)
        return True

    def _try_place(self, entry: Entry, result: CycleResult, exclude: np.ndarray | None) -> bool:
        result.evaluated += 1
        wl = entry.workload
        first_new = len(entry.placed)
        placed = pl.place_all(
            wl.pods[first_new:], wl.pod_names[first_new:], self.view, self.profile, exclude, learn=True
        )
        entry.placed.extend(placed)
        self._account(entry, entry.pod_charges[first_new : len(entry.placed)], +1)
        if len(entry.placed) < len(wl.pods) and any(not p.permit(wl, len(entry.placed)) for p in self.profile.permit):
            while len(entry.placed) > first_new:
                self._release(entry, len(entry.placed) - 1)
                entry.placed.pop()
            return False
        for i in range(first_new, len(entry.placed)):
            result.bound.append(Bound(wl.name, i, wl.pod_names[i], entry.placed[i]))
        if len(entry.placed) < wl.needed:
            self._forget_key(entry)
            entry.key = self._attempt_key(entry)
            keys = self._keys[entry.queue]
            keys[entry.key] = keys.get(entry.key, 0) + 1
            return False
        return True

    def _start(self, entry: Entry, result: CycleResult, now: float) -> None:
        del self.pending[entry.workload.name]
        self._forget_key(entry)
        entry.started = now
        if self.reservations:
            entry.backfilled = self.reservations.entered(entry.workload, entry.queue, [p.node for p in entry.placed])
        self.running[entry.workload.name] = entry
        if len(entry.placed) < len(entry.workload.pods):
            self.growth.growable.add(entry.workload.name)  # elastic: grows into idle capacity after each cycle
        result.started.append(entry.workload.name)
        self.reservations.pop(entry.workload.name, None)

    # -- bookkeeping --------------------------------------------------------------------------------
    def _account(self, entry: Entry, charges: Sequence[np.ndarray], sign: int) -> None:
        """Pods of `entry` placed (sign +1) or released (-1), by their charges, in turn: its queue's usage up
        the tree, its user's holding, what its queue holds by its own order."""
        if not charges:
            return
        self.preempting.placements_changed()
        backlog = self.backlogs[entry.queue]
        if backlog.by_user:  # only a queue fair among its users keeps what each holds
            # each pod's dominant share, then signed: the max of a negated vector is its least share
            for charge in charges:
                backlog.account(entry.user, sign * self.accounting.dominant(charge))
        self.view.add_usage(entry.queue, charges, sign)
        if self.lending.on:  # (a call per pod that does nothing, otherwise)
            for charge in charges:
                self.lending.account(entry, charge, sign)

    def _release(self, entry: Entry, i: int) -> Placement:
        wl = entry.workload
        placement = self.state.release(wl.pod_names[i])
        self._account(entry, (entry.pod_charges[i],), -1)
        return placement

    def _attempt_key(self, entry: Entry) -> int:
        rest = entry.rest
        needed = entry.workload.needed - len(entry.placed)
        key = (needed, tuple(p.key() for p in rest)) if self.profile.gang else (rest[0].key(),)
        return self._key_ids.setdefault(key, len(self._key_ids))

    def _forget_key(self, entry: Entry) -> None:
        keys = self._keys[entry.queue]
        left = keys[entry.key] - 1
        if left > 0:
            keys[entry.key] = left
        else:
            del keys[entry.key]
