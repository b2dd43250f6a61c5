"""Built-in plugins; importing this package registers them."""

from fairgpu.plugins import baselines, fit, fragmentation, gang, gputype, quota, scores, sort

__all__ = ["baselines", "fit", "fragmentation", "gang", "gputype", "quota", "scores", "sort"]
