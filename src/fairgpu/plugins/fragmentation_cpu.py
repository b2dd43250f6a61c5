"""`Fragmentation.cpu_balance`'s measure: the GPU capacity a node's free CPU cannot feed at the CPU its free
GPUs are expected to need, priced at what FGD's measure charges for capacity none of its shapes can use; and,
with `memory`, per shape the capacity of its GPUs the node's free memory cannot feed."""

from __future__ import annotations

import numpy as np

from fairgpu.plugins import fragmentation_kernels as kernels
from fairgpu.plugins.fragmentation_mix import ShapeMix
from fairgpu.plugins.fragmentation_nodes import Aggregates


def need_and_price(
    agg: Aggregates, mix: ShapeMix, w: np.ndarray, rows: np.ndarray, compiled: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(rows,) the CPU per GPU percent the node's free GPUs need: that of the shapes that can use them (a
    model they allow, enough GPUs with room, enough memory; CPU is what is priced), by GPU demand, plus
    the CPU-only pods' share; and the price of a percent they cannot feed: what FGD's measure charges for
    a percent none of those shapes can use, the sum of their weights `w`. Need 0 where no shape can use the
    node or none needs CPU."""
    if compiled:  # the need in the kernel (its sums add integers: exact in any order), the price a product
        return kernels.need_price(
            rows, agg.free, agg.wide_count, agg.mem, agg.wide_access, mix.k, mix.mem, mix.need_cpu, mix.need_gpu,
            mix.cpu_only_per_core, w.astype(np.float64),
        )  # fmt: skip
    uses = ((agg.fit_count[rows] >= mix.k) & (agg.mem[rows][:, None] >= mix.mem) & agg.access[rows]) * 1.0
    # sums of integers, so exact in any order
    cpu_of, gpu_of, price = uses @ mix.need_cpu, uses @ mix.need_gpu, uses @ w.astype(np.float64)
    need = np.divide(cpu_of, gpu_of, out=np.zeros(len(rows)), where=gpu_of > 0) + mix.cpu_only_per_core
    return np.where(gpu_of > 0, need, 0.0), np.asarray(price)


def starved(
    agg: Aggregates,
    mix: ShapeMix,
    w: np.ndarray,
    rows: np.ndarray,
    taken: int,
    cpu_m: int,
    mem_m: int,
    weight: float,
) -> np.ndarray:
    """Change in the price of the GPU capacity the node's free CPU could not feed once a pod took `taken` GPU
    percent, `cpu_m` of CPU and `mem_m` of memory there, at the node's need and price as it is
    (`need_and_price`): taking CPU never lowers the estimate; plus, shape by shape, that of the capacity its
    free memory could not feed (`memory_short`). The NumPy path; the compiled one is `kernels.starved`, inside
    the plugin's delta kernels."""
    need, price = agg.need[rows], agg.price[rows]
    ok = need > 0  # else no shape can use the node (FGD's measure counts all of it lost already) or needs CPU
    free, cpu = agg.free[rows].sum(axis=1), agg.cpu[rows]
    before = np.maximum(0.0, free - np.divide(cpu, need, out=np.zeros(len(rows)), where=ok))
    after = np.maximum(0.0, free - taken - np.divide(cpu - cpu_m, need, out=np.zeros(len(rows)), where=ok))
    cpu_part = weight * price * np.where(ok, after - before, 0.0)
    return np.asarray(cpu_part + weight * memory_short(agg, mix, w, rows, taken, mem_m))


def memory_short(agg: Aggregates, mix: ShapeMix, w: np.ndarray, rows: np.ndarray, taken: int, mem_m: int) -> np.ndarray:
    """(rows,) change in Σ_t w_t · the free capacity of shape t's GPUs with room on the node that the node's
    free memory cannot feed at t's own memory per GPU percent, once a pod took `taken` of the capacity and
    `mem_m` of the memory (shapes that can use the node now, as `need_and_price` counts them). Per shape, not
    at a node's average need: a mix of light pods and pods asking more memory than a GPU's share of the node
    has memory bind only for the latter, where an average binds for none or for all. FGD's measure asks
    whether one pod of the shape fits; this asks how many, so a pod taking the memory the shape's next pods
    needed beside free GPUs pays for those GPUs as FGD's measure does for the last pod's."""
    if not mix.gpu_per_mib.any():  # memory left out, or no shape asks any: nothing to feed
        return np.zeros(len(rows))
    # the NumPy path's; the compiled one is in kernels.starved (`_memory_sum`)
    fit_free, mem = agg.fit_free[rows].astype(np.float64), agg.mem[rows].astype(np.float64)[:, None]
    uses = (agg.fit_count[rows] >= mix.k) & (agg.mem[rows][:, None] >= mix.mem) & agg.access[rows]
    before = np.maximum(0.0, fit_free - mem * mix.gpu_per_mib)
    after = np.maximum(0.0, np.maximum(fit_free - taken, 0.0) - (mem - mem_m) * mix.gpu_per_mib)
    weighed = np.where(uses & (mix.gpu_per_mib > 0), after - before, 0.0) * w.astype(np.float64)
    # summed shape after shape, as the kernel does (which skips the zeros: adding 0 changes no float)
    return np.asarray(np.cumsum(weighed, axis=1)[:, -1])
