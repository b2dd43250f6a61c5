"""Plain data the engine works on: nodes and GPUs, pods and workloads, queues."""

from fairgpu.errors import RequestError
from fairgpu.model.node import GpuDevice, NodeSpec
from fairgpu.model.pod import GpuRequest, PodSpec, Workload, gpu_request
from fairgpu.model.queue import QueueSpec, QueueTree

__all__ = [
    "GpuDevice",
    "GpuRequest",
    "NodeSpec",
    "PodSpec",
    "QueueSpec",
    "QueueTree",
    "RequestError",
    "Workload",
    "gpu_request",
]
