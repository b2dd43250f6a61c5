"""The scheduling loop made faster without changing a decision: every decision of seeded cycles over a queue
tree (many leaves under two levels of organisations, per-user queues, priorities, gangs, a cluster that
fills, work finishing between cycles) is the one the engine made before (digests recorded at c50c514,
before the loop's per-attempt work was cut: cached queue heads, flat backlog keys, a gang's pods charged
together, the memo's undone-shape witness, scalar `fits`)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from conftest import gpu_node
from fairgpu.catalog import load_profile
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import GpuRequest, PodSpec, QueueSpec, QueueTree, Workload


def tree() -> QueueTree:
    """Two organisations of weights 1 and 3, three teams each, and 2–4 leaves per team (18 leaves); every
    third leaf is fair among its users."""
    specs = [QueueSpec("org0", weight=1.0), QueueSpec("org1", weight=3.0)]
    leaves = 0
    for o in range(2):
        for t in range(3):
            team = f"org{o}.t{t}"
            specs.append(QueueSpec(team, weight=float(1 + t), parent=f"org{o}"))
            for leaf in range(2 + (o + t) % 3):
                within = "users" if leaves % 3 == 0 else "fifo"
                half_life = 600.0 if leaf == 1 else 0.0  # some decayed past usage in the share ratio
                specs.append(
                    QueueSpec(f"{team}.q{leaf}", weight=float(1 + leaf % 2), parent=team, fair_within=within,
                              usage_half_life=half_life)
                )  # fmt: skip
                leaves += 1
    return QueueTree(specs)


def pod(rng: np.random.Generator) -> PodSpec:
    u = rng.random()
    if u < 0.55:
        count = int(rng.choice([1, 1, 1, 2, 4, 8]))
        return PodSpec(cpu_m=4000 * count, memory_mib=8192 * count, gpu=GpuRequest(count, 100, 0, 100))
    cores = int(rng.choice([10, 25, 50]))
    return PodSpec(cpu_m=1000, memory_mib=2048, gpu=GpuRequest(1, cores, int(rng.integers(2, 12)) * 1024))


def decisions(profile: str, seed: int) -> tuple[str, int]:
    """Four cycles, each after new submissions and a third of the running work finishing: the digest of every
    decision and of each queue's usage after each cycle, and the pods placed."""
    rng = np.random.default_rng(seed)
    qt = tree()
    leaves = [qt.queues[q].name for q in qt.leaves]
    nodes = [gpu_node(f"n{i}", gpus=8, mem_mib=40960, cpu_m=96_000) for i in range(12)]
    sched = Scheduler(nodes, qt, load_profile(profile))
    digest, placed = hashlib.sha256(), 0
    for c in range(4):
        for i in range(60):
            size = int(rng.integers(2, 6)) if rng.random() < 0.15 else 1
            sched.submit(
                Workload(
                    f"w{c}-{i}",
                    leaves[int(rng.integers(len(leaves)))],
                    (pod(rng),) * size,
                    user=f"u{int(rng.integers(3))}",
                    priority=int(rng.integers(2)),
                    submit_time=float(c),
                )
            )
        result = sched.cycle(float(c))
        digest.update(repr((result.bound, result.started, result.evictions, result.attempts)).encode())
        digest.update(sched.view.usage.tobytes() + sched.view.share_ratio.tobytes())
        placed += len(result.bound)
        for name in sorted(sched.running)[: len(sched.running) // 3]:
            sched.remove(name, finished_at=float(c) + 0.5)
    return digest.hexdigest()[:16], placed


@pytest.mark.parametrize(("profile", "pinned"), [("fairgpu", "fc375bb0c507d499"), ("kube-default", "fcedf77fcbb5aae6")])
def test_every_decision_of_cycles_over_a_queue_tree_is_as_before(profile: str, pinned: str) -> None:
    digest, placed = decisions(profile, 7)
    assert placed > 120  # the cluster (96 GPUs) filled and emptied in part several times
    assert digest == pinned
