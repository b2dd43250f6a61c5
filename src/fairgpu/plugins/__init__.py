"""Built-in plugins; importing this package registers them."""

from fairgpu.plugins import fit, gang, gputype, preemption, quota, scores, sort

__all__ = ["fit", "gang", "gputype", "preemption", "quota", "scores", "sort"]
