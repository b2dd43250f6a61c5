"""Trace loaders: the Alibaba openb CSVs, Gavel's Philly-VC CSV and fairgpu's own recorded traces (JSON lines,
twin/schema.py) into the engine's model.

Attribution: openb is Alibaba's cluster-trace-gpu-v2023 (Weng et al., "Beware of Fragmentation", USENIX
ATC 2023; research and study use). Philly-VC comes from the Gavel project (MIT), derived from the
Microsoft Philly traces (CC BY 4.0).
"""

from __future__ import annotations

import ast
import csv
import gzip
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from fairgpu.errors import ScenarioError
from fairgpu.model import GpuDevice, NodeSpec, PodSpec, QueueSpec, Workload
from fairgpu.model.pod import GpuRequest
from fairgpu.sim.recorded import read_fairgpu
from fairgpu.sim.scenario import Scenario
from fairgpu.state import ClusterState

# openb gives GPU models but not their memory. Public specs where known; G2/G3 are undisclosed internal
# types, taken as 32 GiB. Fractional openb pods take memory in proportion to their compute share, so
# these sizes do not change where anything fits.
OPENB_GPU_MEMORY_MIB = {"P100": 16384, "T4": 15360, "V100M16": 16384, "V100M32": 32768, "A10": 24576}
OPENB_DEFAULT_GPU_MEMORY_MIB = 32768

# Philly VCs ran on 8-GPU nodes; only GPUs are given, so CPU and memory are sized never to bind first.
PHILLY_GPUS_PER_NODE = 8
PHILLY_NODE = {"cpu_m": 64_000, "memory_mib": 512 * 1024, "gpu_memory_mib": 32768}
PHILLY_PER_GPU = {"cpu_m": 4_000, "memory_mib": 32 * 1024}
PHILLY_THROUGHPUTS = "simulation_throughputs.json.gz"  # Gavel's, beside the trace CSV
# columns the published files carry that the loaders do not need; anything else is refused
OPENB_OPTIONAL = ("pod_phase", "scheduled_time")
OPENB_FILL_OPTIONAL = ("gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")
PHILLY_OPTIONAL = ("needs_data_dir", "iso_duration_s_p100", "iso_duration_s_k80")

T = TypeVar("T")


def _rows(
    path: Path, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of a CSV whose header has every required column and nothing unknown; a binary
    file, a row longer than the header or a broken quote is a ScenarioError naming file and line."""
    if not path.is_file():
        raise ScenarioError(f"{path}: no such file")
    line = 1
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise ScenarioError(f"{path}: missing column {missing[0]!r}")
            unknown = [c for c in header if c not in required and c not in optional]
            if unknown:
                known = ", ".join((*required, *optional))
                raise ScenarioError(f"{path}: unknown column {unknown[0]!r} (known: {known})")
            for line, row in enumerate(reader, start=2):
                if None in row:
                    raise ScenarioError(f"{path}:{line}: more fields than the header's {len(header)} columns")
                yield line, row
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}:{line + 1}: not a text CSV (bytes that are not UTF-8)") from None
    except csv.Error as err:
        raise ScenarioError(f"{path}:{line + 1}: not a valid CSV ({err})") from None


def _field(path: Path, line: int, row: dict[str, str], col: str, conv: Callable[[str], T], *, min_: float = 0) -> T:
    raw = (row.get(col) or "").strip()
    try:
        value = conv(raw)
    except ValueError:
        raise ScenarioError(f"{path}:{line}: {col}: {raw!r} is not a number") from None
    if isinstance(value, int | float) and not math.isfinite(value):
        raise ScenarioError(f"{path}:{line}: {col}: {raw!r} is not a finite number")
    if isinstance(value, int | float) and value < min_:
        raise ScenarioError(f"{path}:{line}: {col}: {raw!r} must be ≥ {min_:g}")
    return value


def _unique(path: Path, column: str, names: list[tuple[int, str]]) -> None:
    """Names are keys (nodes, workloads): a repeated one is an error naming both lines."""
    first: dict[str, int] = {}
    for line, name in names:
        if name in first:
            raise ScenarioError(f"{path}:{line}: {column}: {name!r} is also on line {first[name]}")
        first[name] = line


def openb_pod(cpu_milli: int, memory_mib: int, num_gpu: int, gpu_milli: int, gpu_spec: str) -> PodSpec:
    """An openb pod: k whole GPUs, or one GPU shared by compute share (memory in the same proportion)."""
    gpu = None
    if num_gpu > 0:
        if gpu_milli >= 1000:
            gpu = GpuRequest(count=num_gpu, cores=100, mem_mib=0, mem_pct=100)
        else:
            pct = max(1, math.ceil(gpu_milli / 10))
            gpu = GpuRequest(count=num_gpu, cores=pct, mem_mib=0, mem_pct=pct)
    include = tuple(s for s in gpu_spec.split("|") if s)
    return PodSpec(cpu_m=cpu_milli, memory_mib=memory_mib, gpu=gpu, gpu_include=include)


def load_openb_nodes(path: Path) -> list[NodeSpec]:
    nodes, names = [], []
    for line, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        gpus = _field(path, line, row, "gpu", int)
        model = (row.get("model") or "").strip()
        if gpus and not model:
            raise ScenarioError(f"{path}:{line}: model: a node with GPUs needs a GPU model")
        mem = OPENB_GPU_MEMORY_MIB.get(model, OPENB_DEFAULT_GPU_MEMORY_MIB)
        name = row["sn"].strip()
        names.append((line, name))
        nodes.append(
            NodeSpec(
                name=name,
                cpu_m=_field(path, line, row, "cpu_milli", int),
                memory_mib=_field(path, line, row, "memory_mib", int),
                gpus=tuple(GpuDevice(model, mem, uuid=f"GPU-{name}-{j}") for j in range(gpus)),
            )
        )
    if not nodes:
        raise ScenarioError(f"{path}: no nodes")
    _unique(path, "sn", names)
    return nodes


def load_openb(pods_path: Path, nodes_path: Path) -> Scenario:
    """Time-driven openb replay: each pod is a workload in the queue named by its QoS class, submitted at
    its creation time and running for deletion − scheduled (or − creation, for never-scheduled) time."""
    nodes = load_openb_nodes(nodes_path)
    cols = (
        "name",
        "cpu_milli",
        "memory_mib",
        "num_gpu",
        "gpu_milli",
        "gpu_spec",
        "qos",
        "creation_time",
        "deletion_time",
    )
    empty = ClusterState(nodes)
    workloads, names = [], []
    for line, row in _rows(pods_path, cols, OPENB_OPTIONAL):
        pod = openb_pod(
            _field(pods_path, line, row, "cpu_milli", int),
            _field(pods_path, line, row, "memory_mib", int),
            _field(pods_path, line, row, "num_gpu", int),
            _field(pods_path, line, row, "gpu_milli", int),
            row.get("gpu_spec") or "",
        )
        problem = empty.unplaceable_reason(pod)
        if problem:  # e.g. more GPUs than any node of the node list has
            raise ScenarioError(f"{pods_path}:{line}: {problem} in {nodes_path.name}")
        created = _field(pods_path, line, row, "creation_time", float)
        deleted = _field(pods_path, line, row, "deletion_time", float)
        sched_raw = (row.get("scheduled_time") or "").strip()
        started = _field(pods_path, line, row, "scheduled_time", float) if sched_raw else created
        if started < created:
            raise ScenarioError(f"{pods_path}:{line}: scheduled_time is before creation_time")
        if deleted < started:
            raise ScenarioError(f"{pods_path}:{line}: deletion_time is before the pod was created or started")
        names.append((line, row["name"].strip()))
        workloads.append(
            Workload(
                name=row["name"].strip(),
                queue=(row.get("qos") or "").strip() or "default",
                pods=(pod,),
                submit_time=created,
                duration=max(1.0, deleted - started),
            )
        )
    if not workloads:
        raise ScenarioError(f"{pods_path}: no pods")
    _unique(pods_path, "name", names)
    queues = [QueueSpec(name) for name in sorted({w.queue for w in workloads})]
    horizon = max(w.submit_time + (w.duration or 0) for w in workloads)
    return Scenario(f"openb:{pods_path.name}", horizon, nodes, queues, workloads, "Alibaba openb trace, queue = QoS")


def _philly_throughputs(path: Path) -> dict[str, dict[int, float]] | None:
    """Gavel's measured V100 throughputs: job type → {GPUs: steps per second alone}; None if absent."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(gzip.decompress(path.read_bytes()))
        out: dict[str, dict[int, float]] = {}
        for key, entry in doc["v100"].items():
            job_type, gpus = ast.literal_eval(key)
            out.setdefault(job_type, {})[int(gpus)] = float(entry["null"])
        return out
    except (OSError, ValueError, KeyError, TypeError, SyntaxError) as err:
        raise ScenarioError(f"{path}: not a Gavel throughput file: {err}") from None


def _philly_derived_duration(
    path: Path, line: int, row: dict[str, str], gpus: int, throughputs: dict[str, dict[int, float]] | None
) -> float:
    """Gavel measured no throughput at this GPU count (e.g. 16, 32, 12): scale the throughput at the
    largest measured count below it linearly with the GPUs (data-parallel), as the trace's steps assume."""
    job_type = (row.get("job_type") or "").strip()
    measured = (throughputs or {}).get(job_type)
    if not measured:
        why = f"no {PHILLY_THROUGHPUTS} beside the trace" if throughputs is None else f"no throughput for {job_type!r}"
        raise ScenarioError(f"{path}:{line}: iso_duration_s_v100: empty, and {why} to derive it")
    base = max((g for g in measured if g <= gpus), default=min(measured))
    steps = _field(path, line, row, "total_steps", float, min_=1)
    return steps / (measured[base] * gpus / base)


def load_philly(path: Path, gpus: int) -> Scenario:
    """Philly-VC replay on `gpus` V100s (8 per node): one queue per VC, equal weights; a job of more than
    8 GPUs is a gang of 8-GPU pods, run time is its V100 duration (derived from Gavel's throughputs where
    the trace leaves it empty)."""
    if gpus < PHILLY_GPUS_PER_NODE or gpus % PHILLY_GPUS_PER_NODE:
        raise ScenarioError(f"--gpus: {gpus} must be a positive multiple of {PHILLY_GPUS_PER_NODE}")
    gpu_mem = PHILLY_NODE["gpu_memory_mib"]
    nodes = [
        NodeSpec(
            f"philly-{i}",
            PHILLY_NODE["cpu_m"],
            PHILLY_NODE["memory_mib"],
            tuple(GpuDevice("V100-32GB", gpu_mem, uuid=f"GPU-philly-{i}-{j}") for j in range(PHILLY_GPUS_PER_NODE)),
        )
        for i in range(gpus // PHILLY_GPUS_PER_NODE)
    ]
    workloads = []
    throughputs = _philly_throughputs(path.parent / PHILLY_THROUGHPUTS)
    required = ("vc", "job_seq", "job_type", "total_steps", "arrival_time_s", "num_gpus", "iso_duration_s_v100")
    names = []
    for line, row in _rows(path, required, PHILLY_OPTIONAL):
        n = _field(path, line, row, "num_gpus", int, min_=1)
        if n > gpus:
            raise ScenarioError(f"{path}:{line}: num_gpus: {n} is more than the cluster's {gpus} GPUs")
        per_pod = min(n, PHILLY_GPUS_PER_NODE)
        pods = []
        for k in range(math.ceil(n / PHILLY_GPUS_PER_NODE)):
            count = min(per_pod, n - k * per_pod)
            pods.append(
                PodSpec(
                    cpu_m=PHILLY_PER_GPU["cpu_m"] * count,
                    memory_mib=PHILLY_PER_GPU["memory_mib"] * count,
                    gpu=GpuRequest(count=count, cores=100, mem_mib=0, mem_pct=100),
                )
            )
        vc = row["vc"].strip()
        if (row.get("iso_duration_s_v100") or "").strip():
            duration = _field(path, line, row, "iso_duration_s_v100", float)
        else:
            duration = _philly_derived_duration(path, line, row, n, throughputs)
        names.append((line, f"{vc}-{row['job_seq'].strip()}"))
        workloads.append(
            Workload(
                name=names[-1][1],
                queue=vc,
                pods=tuple(pods),
                submit_time=_field(path, line, row, "arrival_time_s", float),
                duration=max(1.0, duration),
            )
        )
    if not workloads:
        raise ScenarioError(f"{path}: no jobs")
    _unique(path, "vc, job_seq", names)
    queues = [QueueSpec(name) for name in sorted({w.queue for w in workloads})]
    # up to the last arrival (the trace's span); a trace whose jobs all arrive at once runs until the
    # longest would end alone, not for no time at all
    horizon = max(w.submit_time for w in workloads) or max(w.duration or 0.0 for w in workloads)
    return Scenario(f"philly:{path.name}", horizon, nodes, queues, workloads, f"Philly VC trace on {gpus} GPUs")


def load_fairgpu(path: Path) -> Scenario:
    """A trace fairgpu recorded (sim/recorded.py reads it)."""
    return read_fairgpu(path).scenario
