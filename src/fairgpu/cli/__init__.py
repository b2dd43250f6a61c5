"""The `fairgpu` command: one module per command group, each registering on the app in base.py."""

from fairgpu.cli import builtins, fill_experiment, imports, run, simulate, twin  # noqa: F401  (they register commands)
from fairgpu.cli.base import app
from fairgpu.k8s import kubectl

# `fairgpu queues|workloads|why|top`: the kubectl plugin's commands, under the main command too
app.registered_commands.extend(kubectl.app.registered_commands)
# --help lists the simulator's commands first, in the order a newcomer meets them
_FIRST = ("simulate", "fill", "validate", "profiles", "run")
app.registered_commands.sort(key=lambda c: _FIRST.index(c.name) if c.name in _FIRST else len(_FIRST))

__all__ = ["app"]
