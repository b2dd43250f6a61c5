"""Prometheus metrics under `fairgpu_` (docs/metrics.md, "Prometheus metrics").

Counters and histograms are fed by the driver through `SchedulingMetrics.on_cycle`; every gauge is read
from the engine at scrape time by `EngineCollector`, so a scrape costs the same however long the
scheduler has run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from fairgpu import resources as r
from fairgpu.framework.scheduler import CycleResult, Scheduler
from fairgpu.observe.accounting import gpu_accounting
from fairgpu.state import ClusterState

if TYPE_CHECKING:
    from fairgpu.observe.source import Source

P = "fairgpu_"
# Waits run from seconds (an idle cluster) to days (a backlogged queue in a trace replay).
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400, 259200, float("inf"))
ATTEMPT_BUCKETS = (1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, float("inf"))
# Quantities in the engine's units (resources.py) → Prometheus base units.
_TO_BASE = {"gpu": 1.0, "gpumem": float(r.MIB), "cpu": 1e-3, "memory": float(r.MIB)}
_SCALE = np.array([_TO_BASE[d] for d in r.FAIR_DIMS])
GPU_LABELS = ("node", "gpu_uuid", "gpu_index", "model")


class SchedulingMetrics:
    """Counters and histograms of what the scheduler did, fed once per cycle by the driver."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.attempts = Counter(
            P + "schedule_attempts",
            "Workload scheduling attempts by result (scheduled: all its pods now run; unschedulable: not).",
            ["result", "profile"],
            registry=registry,
        )
        self.attempt_duration = Histogram(
            P + "scheduling_attempt_duration_seconds",
            "Wall-clock seconds per scheduling attempt: each cycle's time over its attempts, once per cycle.",
            ["profile"],
            buckets=ATTEMPT_BUCKETS,
            registry=registry,
        )
        self.preemptions = Counter(P + "preemptions", "Workloads evicted by preemption.", ["reason"], registry=registry)
        self.sli = Histogram(
            P + "pod_scheduling_sli_duration_seconds",
            "Seconds from a workload's submission to all its pods running (scheduler clock).",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.admission_wait = Histogram(
            P + "queue_admission_wait_time_seconds",
            "Seconds from submission to start, per leaf queue.",
            ["queue"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )

    def on_cycle(self, sched: Scheduler, result: CycleResult, now: float, seconds: float) -> None:
        profile = sched.profile.name
        started = len(result.started)
        self.attempts.labels("scheduled", profile).inc(started)
        self.attempts.labels("unschedulable", profile).inc(max(0, result.attempts - started))
        if result.attempts:
            self.attempt_duration.labels(profile).observe(seconds / result.attempts)
        for ev in result.evictions:
            self.preemptions.labels(reason_kind(ev.reason)).inc()
        for name in result.started:
            wl = sched.status(name)
            wait = max(0.0, now - wl.submitted)
            self.sli.observe(wait)
            self.admission_wait.labels(wl.queue).observe(wait)


def reason_kind(reason: str) -> str:
    """The engine's eviction reason names the workload it makes room for ("preempted for b-3"); the label
    keeps only the words before that name, so its values stay few."""
    for cut in (" for ", " so that "):
        reason = reason.split(cut, 1)[0]
    return reason


class EngineCollector(Collector):
    """Gauges read from the engine at scrape time, vectorised over queues and GPU slots."""

    def __init__(self, source: Source) -> None:
        self.source = source
        # per-GPU label sets never change for one ClusterState: built once, shared by the four GPU metrics
        self._gpu_labels: tuple[ClusterState, list[dict[str, str]]] | None = None

    def collect(self) -> Iterator[Metric]:
        src = self.source
        with src.lock:
            sched = src.sched
            if sched is not None:  # a live controller has no engine until it knows its nodes
                yield from _queue_metrics(sched)
                yield from _gpu_metrics(sched.state, self._labels_of(sched.state))
                yield from _cluster_metrics(sched)
            leader = GaugeMetricFamily(
                P + "leader_election_master_status", "1 when this replica is the leader.", labels=["name"]
            )
            leader.add_metric(["fairgpu"], 1.0 if src.is_leader() else 0.0)
            yield leader

    def _labels_of(self, st: ClusterState) -> list[dict[str, str]]:
        if self._gpu_labels is None or self._gpu_labels[0] is not st:
            rows, cols = np.nonzero(st.gpu_valid)
            labels = [
                {"node": st.node_names[i], "gpu_uuid": st.nodes[i].gpus[j].uuid, "gpu_index": str(j),
                 "model": st.models[st.gpu_model[i, j]]}
                for i, j in zip(rows.tolist(), cols.tolist(), strict=True)
            ]  # fmt: skip
            self._gpu_labels = (st, labels)
        return self._gpu_labels[1]


def _queue_metrics(sched: Scheduler) -> Iterator[Metric]:
    tree, v = sched.tree, sched.view
    names = tree.names()
    per_resource = (
        ("queue_usage", "What the queue's placed pods hold (an inner queue: its subtree).", v.usage),
        ("queue_fair_share", "The queue's entitlement: weighted max-min fair share of current demand.", v.entitled),
        ("queue_guaranteed", "The queue's guaranteed quota (absent when unconstrained).", tree.guaranteed),
        ("queue_limit", "The queue's limit (absent when unconstrained).", tree.limit),
    )
    for name, doc, values in per_resource:
        doc += " Units: gpu in GPUs, cpu in cores, gpumem and memory in bytes."
        fam = GaugeMetricFamily(P + name, doc, labels=["queue", "resource"])
        scaled = values * _SCALE
        for q, d in zip(*np.nonzero(np.isfinite(scaled)), strict=True):
            fam.add_metric([names[q], r.FAIR_DIMS[d]], float(scaled[q, d]))
        yield fam
    pending_wl = GaugeMetricFamily(P + "queue_pending_workloads", "Workloads waiting in the queue.", labels=["queue"])
    counts = tree.rollup(sched.workload_counts()[0])  # an inner queue counts its subtree
    for q, n in enumerate(counts):
        pending_wl.add_metric([names[q]], float(n))
    yield pending_wl
    # pods of pending workloads: not placed yet, or placed but waiting for the rest of their gang
    unplaced = np.zeros(len(tree))
    held = np.zeros(len(tree))
    index = tree.index
    for w in sched.workloads("pending"):
        unplaced[index[w.queue]] += w.pods - w.placed
        held[index[w.queue]] += w.placed
    pods = GaugeMetricFamily(P + "pending_pods", "Pods of pending workloads, by state.", labels=["queue", "state"])
    for q in tree.leaves:
        pods.add_metric([names[q], "unplaced"], float(unplaced[q]))
        pods.add_metric([names[q], "gang_waiting"], float(held[q]))
    yield pods


def _gpu_metrics(st: ClusterState, labels: list[dict[str, str]]) -> Iterator[Metric]:
    rows, cols = np.nonzero(st.gpu_valid)  # the order `labels` was built in
    series = (
        ("gpu_cores_allocated_ratio", "Fraction of the GPU's cores held by pods.",
         (st.gpu_cores_cap - st.gpu_cores_free)[rows, cols] / 100.0),
        ("gpu_memory_allocated_bytes", "GPU memory held by pods.",
         (st.gpu_mem_cap - st.gpu_mem_free)[rows, cols] * float(r.MIB)),
        ("gpu_memory_total_bytes", "GPU memory.", st.gpu_mem_cap[rows, cols] * float(r.MIB)),
        ("gpu_shared_pods", "Pods sharing the GPU.", st.gpu_tasks[rows, cols].astype(np.float64)),
    )  # fmt: skip
    for name, doc, values in series:
        fam = GaugeMetricFamily(P + name, doc, labels=list(GPU_LABELS))
        # Samples built directly: add_metric would copy a label dict per GPU on every scrape
        fam.samples = [Sample(P + name, key, value) for key, value in zip(labels, values.tolist(), strict=True)]
        yield fam


def _cluster_metrics(sched: Scheduler) -> Iterator[Metric]:
    acc = gpu_accounting(sched.state)
    gpus = GaugeMetricFamily(
        P + "cluster_gpus",
        "GPU-equivalents: allocated (cores held / 100), free (idle usable GPUs), fragmented (free cores on "
        "GPUs already holding a pod / 100).",
        labels=["state"],
    )
    for state, values in (("allocated", acc.allocated), ("free", acc.free), ("fragmented", acc.fragmented)):
        gpus.add_metric([state], float(values.sum()))
    yield gpus
    idle = GaugeMetricFamily(
        P + "idle_gpus",
        "Idle GPU-equivalents by cause as of the last cycle (docs/metrics.md, 'Idle GPUs by cause'); they sum "
        "to the idle GPUs.",
        labels=["cause"],
    )
    for cause, value in sched.idle_gpus(sched.view.now).items():
        idle.add_metric([cause], value)
    yield idle
    yield GaugeMetricFamily(
        P + "fairness_jain_index",
        "Jain's index of usage/entitlement over backlogged leaf queues entitled to something; 1 with fewer than two.",
        value=jain_index(sched),
    )


def jain_index(sched: Scheduler) -> float:
    v, tree = sched.view, sched.tree
    contenders = sched.is_backlogged() & tree.is_leaf & (v.entitled_dom > 0)
    if contenders.sum() < 2:
        return 1.0
    x = v.usage_dom[contenders] / v.entitled_dom[contenders]
    denom = len(x) * float((x * x).sum())
    return float(x.sum()) ** 2 / denom if denom > 0 else 0.0
