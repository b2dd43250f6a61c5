"""fairgpu: a fair-share GPU scheduler for Kubernetes and a simulator that runs the same engine."""

__version__ = "0.1.0"
