"""Built-in plugins; importing this package registers them."""

from fairgpu.plugins import affinity, baselines, fit, fragmentation, gang, gputype, preemption, quota, scores, sort

__all__ = [
    "affinity",
    "baselines",
    "fit",
    "fragmentation",
    "gang",
    "gputype",
    "preemption",
    "quota",
    "scores",
    "sort",
]
