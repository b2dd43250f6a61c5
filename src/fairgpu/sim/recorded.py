"""fairgpu's own traces (JSON lines, twin/schema.py) read back for a replay: the scenario, and the run the
cluster made (what `simulate --trace fairgpu:FILE` puts beside the replays)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from fairgpu.errors import RequestError, ScenarioError
from fairgpu.model import NodeSpec, QueueSpec, QueueTree, Workload
from fairgpu.sim.scenario import Change, Scenario
from fairgpu.state import ClusterState
from fairgpu.twin import schema
from fairgpu.twin.encode import queue_doc


@dataclass(slots=True)
class Run:
    """One run of a workload as a trace tells it: seconds from the trace's start; `end` None while running."""

    workload: str
    queue: str
    start: float
    gpus: float  # GPU-equivalents its placed pods held
    end: float | None = None
    evicted: bool = False
    ran: float | None = None  # how long its pods ran, where the driver could tell (less than end − start by
    # the time the cluster took to bind them and to notice they stopped)


@dataclass(slots=True)
class FairgpuTrace:
    """A recorded trace: the scenario to replay and what the cluster did (the recorded run)."""

    scenario: Scenario
    profile: str  # the profile that decided, from the header ("" when recorded passively)
    runs: list[Run] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the replay cannot reproduce, said once each


def read_fairgpu(path: Path) -> FairgpuTrace:
    """A trace written by `fairgpu run --record` or `fairgpu record` (schema: twin/schema.py): the first
    node and queue snapshots are the cluster and later ones change it at their times, every workload arrives
    at its submit time and runs, once started, for as long as its finishing run lasted in the cluster (its
    expected runtime, or to the horizon, if it never finished). Evicted work is requeued by the replay
    itself, as by the cluster's controllers: a resubmission of an evicted workload is the same workload,
    not a new one."""
    head: schema.Header | None = None
    nodes: list[NodeSpec] | None = None
    queues: list[QueueSpec] | None = None
    current: tuple[list[NodeSpec], list[QueueSpec]] | None = None  # the latest snapshots
    changes: dict[float, Change] = {}
    known: set[str] = set()  # every queue any snapshot so far has had
    live_queues: set[str] = set()  # the queues of the latest snapshot
    decided: dict[str, list[float | None]] = {}  # replay name → per eviction decided: its back-off if refused
    origin: float | None = None
    subs: dict[str, tuple[int, schema.Submit]] = {}  # current name → (line, its first submit)
    alias: dict[str, str] = {}  # name in the trace → name in the replay (a name reused after it ended)
    # replay name → outcome of its last end; "requeued" when it left because its queue was deleted (its pods
    # stay, and come back under its name with the queue)
    ended: dict[str, str] = {}
    runs: list[Run] = []
    open_runs: dict[str, Run] = {}
    finished: dict[str, float] = {}  # replay name → length of its finishing run
    notes: list[str] = []
    last = 0.0
    for line, rec in schema.read(path):
        if isinstance(rec, schema.Header):
            head = rec
            continue
        if origin is None:
            origin = rec.t
        t, last = rec.t - origin, rec.t - origin
        where = f"{path}:{line}"
        if isinstance(rec, schema.Nodes):
            specs = [n.spec() for n in rec.nodes]
            try:
                ClusterState(specs)
            except ValueError as err:
                raise ScenarioError(f"{where}: nodes: {err}") from None
            if nodes is None:
                nodes = specs
            elif current is not None and specs != current[0]:
                changes[t] = replace(changes.get(t, Change(t)), nodes=specs)
            current = (specs, current[1] if current else [])
        elif isinstance(rec, schema.Queues):
            try:
                specs_q = [q.to_spec() for q in rec.queues]
                QueueTree(specs_q)
            except ValueError as err:
                raise ScenarioError(f"{where}: queues: {err}") from None
            live_queues = {q.name for q in specs_q}
            known |= live_queues
            if queues is None:
                queues = specs_q
            elif current is not None and _docs(specs_q) != _docs(current[1]):
                changes[t] = replace(changes.get(t, Change(t)), queues=specs_q)
            current = (current[0] if current else [], specs_q)
        elif isinstance(rec, schema.Submit):
            if queues is None or nodes is None:
                raise ScenarioError(f"{where}: kind: a submit before the trace's nodes and queues")
            name = alias.get(rec.workload, rec.workload)
            if name in subs and ended.get(name) not in ("evicted", "requeued") and name not in open_runs:
                if name not in ended:
                    raise ScenarioError(f"{where}: workload: {rec.workload!r} is submitted twice")
                name = f"{rec.workload}#{line}"  # the name reused for new work after the first ended
                alias[rec.workload] = name
            if name not in subs:
                if rec.queue not in known:
                    raise ScenarioError(f"{where}: queue: {rec.queue!r} is not in the trace's queues")
                subs[name] = (line, rec)
            ended.pop(name, None)
        elif isinstance(rec, schema.Start):
            name = alias.get(rec.workload, rec.workload)
            if name not in subs:
                raise ScenarioError(f"{where}: workload: {rec.workload!r} starts but was never submitted")
            if name in open_runs:
                continue  # back in its re-created queue: it never stopped
            sub = subs[name][1]
            placed = sub.pods[: len(rec.nodes) or len(sub.pods)]
            gpus = sum(g.gpu_equivalents() for p in placed if (g := p.spec().gpu) is not None)
            began = t if rec.began is None else max(0.0, rec.began - origin)
            open_runs[name] = Run(name, sub.queue, began, gpus)
            runs.append(open_runs[name])
        elif isinstance(rec, schema.Evict) and rec.pods is None:
            decided.setdefault(alias.get(rec.workload, rec.workload), []).append(None)
        elif isinstance(rec, schema.Refused):
            name = alias.get(rec.workload, rec.workload)
            if not decided.get(name) or decided[name][-1] is not None:
                raise ScenarioError(f"{where}: workload: {rec.workload!r} has no eviction under way to refuse")
            decided[name][-1] = max(0.0, rec.retry - rec.t)
        elif isinstance(rec, schema.End):
            name = alias.get(rec.workload, rec.workload)
            if name not in subs:
                raise ScenarioError(f"{where}: workload: {rec.workload!r} ends but was never submitted")
            gone = rec.outcome == "withdrawn" and subs[name][1].queue not in live_queues
            ended[name] = "requeued" if gone else rec.outcome
            if gone:
                continue  # its pods run on (if they ran) outside any queue: the run goes on
            run = open_runs.pop(name, None)
            if run is not None:
                run.end, run.evicted, run.ran = t, rec.outcome == "evicted", rec.ran
                if rec.outcome == "finished":
                    observed = t - run.start if rec.ran is None else rec.ran
                    finished[name] = _run_length(observed, subs[name][1].duration)
    if head is None or nodes is None or queues is None:
        raise ScenarioError(f"{path}: no node or queue snapshot: not a whole trace")
    workloads = []
    withdrawn = 0
    inventories = [ClusterState(nodes), *(ClusterState(c.nodes) for c in changes.values() if c.nodes is not None)]
    for name, (line, sub) in subs.items():
        if ended.get(name) == "withdrawn" and not any(r.workload == name for r in runs):
            withdrawn += 1  # never ran: the simulator has no withdrawal, and it cost the cluster nothing
            continue
        try:
            pods = tuple(p.spec() for p in sub.pods)
        except RequestError as err:
            raise ScenarioError(f"{path}:{line}: pods.{err.field or 'gpu'}: {err.problem}") from None
        problems = [next((why for p in pods if (why := s.unplaceable_reason(p))), None) for s in inventories]
        problem = problems[0] if all(problems) else None  # some inventory of the trace could hold it
        if problem:
            raise ScenarioError(f"{path}:{line}: pods: {problem} on the trace's nodes")
        workloads.append(
            Workload(
                name=name,
                queue=sub.queue,
                pods=pods,
                submit_time=max(0.0, sub.submitted - (origin or 0.0)),
                priority=sub.priority,
                duration=finished.get(name, sub.duration),
                user=sub.user,
                min_pods=sub.min_pods,
                preemptible=sub.preemptible,
            )
        )
    if withdrawn:
        notes.append(f"{withdrawn} workloads withdrawn before they started are left out of the replay")
    workloads.sort(key=lambda w: w.submit_time)
    origin_text = f"recorded by `fairgpu {head.source}`"
    sc = Scenario(f"fairgpu:{path.name}", max(last, 1.0), nodes, queues, workloads, origin_text)
    sc.changes, sc.recreated = sorted(changes.values(), key=lambda c: c.t), True
    sc.refusals = {name: plan for name, plan in decided.items() if any(b is not None for b in plan)}
    return FairgpuTrace(sc, head.profile, runs, list(dict.fromkeys(notes)))


def _docs(queues: list[QueueSpec]) -> list[dict]:
    return [queue_doc(q) for q in queues]


# An observed run this close to the runtime the workload declared ran that runtime: the difference is the
# cluster's reaction time (and float rounding), and the declared value replays the same instants exactly.
RUNTIME_TOLERANCE = (2.0, 0.01)  # seconds, fraction


def _run_length(observed: float, declared: float | None) -> float:
    if declared is not None and abs(observed - declared) <= max(RUNTIME_TOLERANCE[0], RUNTIME_TOLERANCE[1] * declared):
        return declared
    return observed
