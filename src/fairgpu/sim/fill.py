"""The FGD fill experiment (design/metrics.md, "Fragmentation"): place a shuffled, inflated openb pod list
one pod at a time, never releasing anything, and report unallocated GPU % against arrived load.

Placement is the engine's own (`place_pod` with a profile's filters and scores), so a policy measured
here is exactly what the scheduler does.

Units: the trace gives GPU shares in milli-GPU, the engine in percent of a GPU. Every openb `gpu_milli`
is a multiple of 10, so `openb_pod` converts exactly (and `load_fill_pods` refuses any that is not);
GPU memory is taken in proportion to cores and rounds down, so it never binds before cores. The FGD
simulator has no per-GPU task limit, so nodes here get no HAMi split-count limit either.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from fairgpu.catalog import load_profile, profile_from_dict
from fairgpu.errors import ScenarioError
from fairgpu.framework.placement import UNPLACED_CAUSES, place_pod, unplaced_cause
from fairgpu.framework.profile import Profile
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import NodeSpec, PodSpec, QueueSpec, QueueTree
from fairgpu.sim.traces import OPENB_FILL_OPTIONAL, _field, _rows, load_openb_nodes, openb_pod

TUNING_RATIO = 1.3
LOADS = tuple(range(0, 131, 5))
# failures are broken down by cause up to each of these arrived loads (%)
CAUSE_LOADS = (100, 130)
NO_TASK_LIMIT = 1_000_000
# Scores of the FGD paper's baselines; ties among a baseline's integer scores go to the first node of a
# seeded random order, as in the FGD authors' simulator (see `Random.fixed`).
_TIE = {"name": "Random", "weight": 1e-3, "args": {"fixed": True}}
BASELINES: dict[str, list[dict]] = {
    "random": [{"name": "Random"}],
    "dotprod": [{"name": "DotProd"}, _TIE],
    "gpu-clustering": [{"name": "GpuClustering"}, _TIE],
    "gpu-packing": [{"name": "GpuPacking"}, _TIE],
    "best-fit": [{"name": "BestFit"}, _TIE],
    "fgd": [{"name": "Fragmentation", "args": {"quantize": True}}, _TIE],
}
POLICIES = (*BASELINES, "fairgpu")


@dataclass(slots=True, frozen=True)
class FillPod:
    spec: PodSpec
    gpu_milli: int  # total GPU request in milli-GPU


def load_fill_pods(path: Path) -> list[FillPod]:
    """The pod list sorted by name, time columns dropped."""
    rows = []
    for line, row in _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"), OPENB_FILL_OPTIONAL):
        num_gpu = _field(path, line, row, "num_gpu", int)
        milli = _field(path, line, row, "gpu_milli", int)
        if num_gpu and (milli % 10 or milli == 0 or (milli > 1000)):
            raise ScenarioError(f"{path}:{line}: gpu_milli: {milli} is not a multiple of 10 in 10..1000")
        spec = openb_pod(
            _field(path, line, row, "cpu_milli", int),
            _field(path, line, row, "memory_mib", int),
            num_gpu,
            milli,
            row.get("gpu_spec") or "",
        )
        rows.append((row["name"].strip(), FillPod(spec, num_gpu * milli if num_gpu else 0)))
    if not rows:
        raise ScenarioError(f"{path}: no pods")
    rows.sort(key=lambda item: item[0])
    return [pod for _, pod in rows]


def workload(pods: Sequence[FillPod], capacity_milli: int, seed: int) -> list[FillPod]:
    """Shuffle with the seed, then append uniform draws until the request would exceed 1.3 × capacity."""
    rng = random.Random(seed)
    out = list(pods)
    rng.shuffle(out)
    total = sum(p.gpu_milli for p in out)
    limit = TUNING_RATIO * capacity_milli
    while True:
        extra = pods[rng.randrange(len(pods))]
        if total + extra.gpu_milli > limit:
            return out
        out.append(extra)
        total += extra.gpu_milli


def policy_profile(policy: str, seed: int) -> Profile:
    if policy == "fairgpu":
        return load_profile("fairgpu")
    scores = BASELINES.get(policy)
    if scores is None:
        raise ScenarioError(f"--policy: {policy!r} is not one of {', '.join(POLICIES)}")
    seeded = [{**s, "args": {**s.get("args", {}), "seed": seed}} if s["name"] == "Random" else s for s in scores]
    return profile_from_dict(
        {"name": policy, "queueSort": "PrioritySort", "filter": ["GpuType", "Resources"], "score": seeded}
    )


@dataclass(slots=True)
class FillRun:
    unallocated: dict[int, float]  # unallocated_gpu_pct at each load L of LOADS
    failed: list[tuple[float, str, int]]  # per failed pod: arrived load (%) when tried, cause, GPU request (milli)


def run_fill(nodes: Sequence[NodeSpec], pods: Sequence[FillPod], policy: str, seed: int) -> FillRun:
    """One seed: the load curve and every failure with its cause."""
    nodes = [replace(n, split_count=NO_TASK_LIMIT) for n in nodes]
    profile = policy_profile(policy, seed)
    view = Scheduler(nodes, QueueTree([QueueSpec("fill")]), profile).view
    capacity = view.state.total_gpus * 1000
    arrived = allocated = 0
    points_a, points_b, failed = [], [], []
    for i, pod in enumerate(workload(pods, capacity, seed)):
        arrived += pod.gpu_milli
        placement = place_pod(pod.spec, view, profile, key=str(i))
        if placement is not None:
            view.state.assign(str(i), placement)
            allocated += pod.gpu_milli
        else:
            failed.append((100.0 * arrived / capacity, unplaced_cause(pod.spec, view.state), pod.gpu_milli))
        points_a.append(arrived)
        points_b.append(allocated)
    return FillRun(unallocated_by_load(np.array(points_a), np.array(points_b), capacity), failed)


def unallocated_by_load(arrived: np.ndarray, allocated: np.ndarray, capacity: int) -> dict[int, float]:
    """100 − mean allocated % over the points whose arrived % rounds to L (else those within L ± 1)."""
    arrived_pct = np.round(100.0 * arrived / capacity)
    alloc_pct = 100.0 * allocated / capacity
    out = {}
    for load in LOADS:
        at = arrived_pct == load
        if not at.any():
            at = np.abs(100.0 * arrived / capacity - load) <= 1
        if at.any():
            out[load] = float(100.0 - alloc_pct[at].mean())
    return out


def failures_by_cause(runs: Sequence[FillRun], load: int) -> dict[str, dict[str, float]]:
    """Per cause, the median over runs of the pods that failed for it up to this arrived load, and of their
    GPU request (GPUs); causes no run saw are left out."""
    out = {}
    for cause in UNPLACED_CAUSES:
        hits = [[m for at, c, m in r.failed if c == cause and at <= load] for r in runs]
        if any(hits):
            out[cause] = {
                "pods": statistics.median(len(h) for h in hits),
                "gpus": statistics.median(sum(h) / 1000 for h in hits),
            }
    return out


def fill_experiment(
    nodes_path: Path,
    pods_path: Path,
    policies: Sequence[str],
    seeds: Sequence[int],
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Every policy × seed, seeds in parallel processes; the JSON document `fairgpu fill --json` prints.
    `progress(done, total)` is called as runs finish."""
    for p in policies:
        policy_profile(p, 0)  # a bad name fails here, before any process starts
    nodes, pods = load_openb_nodes(nodes_path), load_fill_pods(pods_path)
    jobs = [(p, s) for p in policies for s in seeds]
    runs: dict[tuple[str, int], FillRun] = {}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_fill, nodes, pods, p, s): (p, s) for p, s in jobs}
        if progress:
            progress(0, len(jobs))
        for future in as_completed(futures):
            runs[futures[future]] = future.result()
            if progress:
                progress(len(runs), len(jobs))
    doc: dict = {"policies": {}, "seeds": list(seeds)}
    for policy in policies:
        done = [runs[policy, s] for s in seeds]
        curves = [r.unallocated for r in done]
        table = {}
        for load in LOADS:
            values = [c[load] for c in curves if load in c]
            if values:
                table[str(load)] = {
                    "median": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                }
        doc["policies"][policy] = {
            "unallocated_gpu_pct": table,
            "failed_by_cause": {str(load): failures_by_cause(done, load) for load in CAUSE_LOADS},
        }
    return doc
