"""The workload mix `Fragmentation` keeps room for, learned online from the pods it is asked to place: one
column per pod shape (its CPU, memory, GPUs and the cores each GPU must have), how often it arrived, and
the weights in use, refreshed when a shape appears or the counts grew by a quarter since."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fairgpu.model.pod import PodSpec

# pod keys already counted into the mix, least recently tried first: a pod tried again after this many
# other pods were first tried counts a second time (memory stays bounded in a controller that runs for months)
_REMEMBERED = 1 << 16
# arrivals between exact sums of the counts: bounds the running sum's rounding error (ShapeMix.running)
_EXACT_EVERY = 1024


def shape_key(pod: PodSpec, memory: bool) -> tuple[Any, ...]:
    g = pod.gpu
    mem = pod.memory_mib if memory else 0
    return (pod.cpu_m, mem, g.count if g else 0, g.cores if g else 0, pod.gpu_include, pod.gpu_exclude)


@dataclass(slots=True)
class ShapeMix:
    keys: dict[tuple[Any, ...], int] = field(default_factory=dict)
    # per shape, how often it arrived (by demand: its GPUs); Python floats, as `shape_cpu` and `shape_gpu`: an
    # arrival adds to one of each, at a fraction of a NumPy element's cost (the same float64 additions)
    counts: list[float] = field(default_factory=list)
    cpu: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    mem: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    k: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    need: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # GPU capacity (percent) one MiB of a node's memory feeds for the shape: its pods' GPU percent over their
    # memory (0 where it asks for no memory or no GPU capacity, or memory is left out: memory feeds it all)
    gpu_per_mib: np.ndarray = field(default_factory=lambda: np.zeros(0))
    pods: list[PodSpec] = field(default_factory=list)
    learned: OrderedDict[str, None] = field(default_factory=OrderedDict)
    # CPU (millicores) of CPU-only pods and GPU capacity (percent) of GPU pods, and per shape its pods' CPU and
    # GPU capacity: integers summed in float64, so exact in any order (the kernels sum them in a loop)
    cpu_only: float = 0.0
    gpu_pct: float = 0.0
    shape_cpu: list[float] = field(default_factory=list)
    shape_gpu: list[float] = field(default_factory=list)
    # Shape weights in use: between refreshes each node's usable capacity stays cached in the plugin
    p: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    p_total: float = 0.0
    # the counts' sum kept as they grow, and the arrivals since it was last `count.sum()`: after k arrivals
    # (non-negative) the two differ by under (2k + 18)·2⁻⁵³ of the sum (each addition rounds once, here and in
    # `count`, and NumPy's pairwise sum of ≤ 512 counts a few times more), so while the running sum is below the
    # refresh threshold by more than that, `count.sum()` (a NumPy call per arrival) is too
    running: float = 0.0
    since_sum: int = 0
    # cpu_balance's sums, refreshed with p: per shape its pods' CPU and GPU capacity, and CPU-only pods'
    # millicores per GPU percent of all GPU pods
    need_cpu: np.ndarray = field(default_factory=lambda: np.zeros(0))
    need_gpu: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cpu_only_per_core: float = 0.0

    @property
    def count(self) -> np.ndarray:
        """(T,) how often each shape arrived."""
        return np.array(self.counts, dtype=np.float64)

    def first_time(self, key: str) -> bool:
        """Whether the pod `key` arrives now (not a retry of one counted already)."""
        if key in self.learned:
            self.learned.move_to_end(key)
            return False
        self.learned[key] = None
        if len(self.learned) > _REMEMBERED:
            self.learned.popitem(last=False)
        return True

    def add(self, pod: PodSpec, memory: bool, by_demand: bool, max_shapes: int, refresh: bool) -> tuple[bool, bool]:
        """Count one arrival of `pod` (one container) as Fragmentation's settings `memory`, `by_demand` and
        `max_shapes` say; refresh the weights when `refresh`, a shape is new or the counts grew by a quarter.
        Returns (a shape was added, the weights were refreshed)."""
        if pod.gpu is None:
            self.cpu_only += pod.cpu_m  # see Fragmentation.cpu_balance
            return False, False  # CPU-only pods leave every node's GPU fragmentation as it is
        gpu_pct = pod.gpu.count * pod.gpu.cores
        self.gpu_pct += gpu_pct
        key = shape_key(pod, memory)
        t = self.keys.get(key)
        added = t is None
        if t is None:
            if len(self.keys) >= max_shapes:
                return False, False
            t = self.keys[key] = len(self.keys)
            self.counts.append(0.0)
            self.cpu = np.append(self.cpu, pod.cpu_m)
            self.mem = np.append(self.mem, pod.memory_mib if memory else 0)
            self.k = np.append(self.k, pod.gpu.count)
            # a GPU takes a shape when its free cores cover the shape's (HAMi: a 0-core task needs > 0)
            self.need = np.append(self.need, max(pod.gpu.cores, 1))
            self.gpu_per_mib = np.append(
                self.gpu_per_mib, gpu_pct / pod.memory_mib if memory and pod.memory_mib else 0.0
            )
            self.shape_cpu.append(0.0)
            self.shape_gpu.append(0.0)
            self.pods.append(pod)  # the aggregates gain its column when next brought up to date
        arrived = pod.gpu.gpu_equivalents() if by_demand else 1
        self.counts[t] += arrived
        self.shape_cpu[t] += pod.cpu_m
        self.shape_gpu[t] += gpu_pct
        self.running += arrived
        self.since_sum += 1
        threshold = self.p_total * (1 + 1 / 4)
        due = refresh or len(self.p) < len(self.counts)
        if not due and self.since_sum < _EXACT_EVERY and self.running < threshold * (1 - 1e-9):
            return added, False  # the exact sum is below the threshold too (see `running`)
        count = self.count
        total = max(float(count.sum()), 1e-9)  # by demand, 0-core pods weigh nothing
        self.running, self.since_sum = total, 0
        if not (due or total > threshold):
            return added, False
        self.p = (count / total).astype(np.float32)
        self.p_total = total
        self.need_cpu, self.need_gpu = np.array(self.shape_cpu), np.array(self.shape_gpu)
        self.cpu_only_per_core = self.cpu_only / max(self.gpu_pct, 1.0)
        return added, True
