"""`kubectl fairgpu` (the `kubectl-fairgpu` plugin, also `fairgpu queues|workloads|why|top`): what the
controller publishes, read through the Kubernetes API with the user's own kubeconfig and permissions —
Queue status (usage, fair share, counts), pods' PodScheduled condition (the engine's explanation) and
HAMi's device annotations. No other path to the scheduler."""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fairgpu import resources as r
from fairgpu.errors import ClusterError, FormatError, InputError
from fairgpu.k8s import hami
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.kubeconfig import check_kubeconfig, resolve_kubeconfig
from fairgpu.k8s.port import NODES, PODS, QUEUES
from fairgpu.k8s.queues import EXCLUSIVE, queue_entries, queue_map
from fairgpu.k8s.translate import QUEUE_LABEL
from fairgpu.terminal import fail

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Queues, workloads and GPUs as fairgpu sees them (kubectl plugin).",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)
OUTPUTS = ("table", "wide", "json", "yaml")
_POSITION = re.compile(r"position in queue [^:]+: (\d+) of (\d+)")
_ESTIMATE = re.compile(r"estimated start: (t=\S+|unknown)")

Kubeconfig = Annotated[str | None, typer.Option(help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config).")]
Output = Annotated[str, typer.Option("--output", "-o", help="table, wide, json or yaml.")]


def _read(kubeconfig: str | None, *reads: tuple[Any, str | None]) -> list[list[dict]]:
    """List each (kind, namespace) with the user's credentials; errors are one line."""
    path = resolve_kubeconfig(kubeconfig)
    try:
        check_kubeconfig(path)
    except InputError as err:
        raise fail(str(err)) from None

    async def go() -> list[list[dict]]:
        port = await KubeClient.connect(path)
        try:
            return [(await port.list(kind, ns))[0] for kind, ns in reads]
        finally:
            await port.close()

    try:
        return asyncio.run(go())
    except ClusterError as err:
        raise fail(f"the API server refused: {err}") from None


def _emit(rows: list[dict[str, Any]], output: str, columns: list[str], wide: list[str], title: str = "") -> None:
    if output not in OUTPUTS:
        raise fail(f"--output: {output!r} must be one of {', '.join(OUTPUTS)}")
    if output == "json":
        typer.echo(json.dumps({"items": rows}, indent=2))
        return
    if output == "yaml":
        typer.echo(yaml.safe_dump({"items": rows}, sort_keys=False), nl=False)
        return
    cols = columns + (wide if output == "wide" else [])
    table = Table(*[c.upper().replace("_", " ") for c in cols], box=None, title=title or None, title_justify="left")
    for row in rows:
        table.add_row(*[escape(_cell(row.get(c))) for c in cols])
    Console(width=1000).print(table)  # as kubectl: columns never wrap; a narrow terminal folds the line


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "∞" if math.isinf(v) else f"{v:g}"
    return str(v)


def _gpus(mapping: dict | None) -> float | None:
    """GPUs in a queue's quota or status mapping (nvidia.com/gpu, or gpucores / 100)."""
    if not mapping:
        return None
    if r.GPU in mapping:
        return float(r.parse_quantity(mapping[r.GPU]))
    if r.GPUCORES in mapping:
        return float(r.parse_quantity(mapping[r.GPUCORES])) / 100
    return None


def queue_rows(queues: list[dict]) -> list[dict[str, Any]]:
    """The queue tree, parents before children, with what each holds against what it is owed."""
    by_parent: dict[str | None, list[dict]] = defaultdict(list)
    for q in queues:
        by_parent[q.get("spec", {}).get("parent")].append(q)
    names = {q["metadata"]["name"] for q in queues}
    roots = [q for q in queues if q.get("spec", {}).get("parent") not in names]
    rows: list[dict[str, Any]] = []

    def walk(q: dict, depth: int) -> None:
        spec, status = q.get("spec", {}), q.get("status", {})
        guarantee, usage = _gpus(spec.get("guaranteed")), _gpus(status.get("usage"))
        lendable = _gpus(spec.get("lendable"))
        lendable = guarantee if lendable is None else lendable
        conditions = {c.get("type"): c for c in status.get("conditions", [])}
        valid: dict[str, Any] = conditions.get("Valid", {})
        shadowed = conditions.get(EXCLUSIVE, {})
        rows.append({
            "name": "  " * depth + q["metadata"]["name"],
            "weight": float(spec.get("weight", 1.0)),
            "guarantee": guarantee or 0.0,
            "limit": _gpus(spec.get("limit")) if _gpus(spec.get("limit")) is not None else math.inf,
            "usage": usage,
            "fair_share": _gpus(status.get("fairShare")),
            "borrowed": None if usage is None else round(max(0.0, usage - (guarantee or 0.0)), 2),
            "lent": None if usage is None or not lendable else round(max(0.0, lendable - usage), 2),
            "pending": status.get("pending"),
            "admitted": status.get("admitted"),
            "valid": valid.get("status"),
            "message": valid.get("message") or (shadowed.get("status") == "False" and shadowed.get("message")) or None,
            "namespaces": ",".join(spec.get("namespaces", [])) or None,
        })  # fmt: skip
        for child in sorted(by_parent.get(q["metadata"]["name"], []), key=lambda c: c["metadata"]["name"]):
            walk(child, depth + 1)

    for q in sorted(roots, key=lambda c: c["metadata"]["name"]):
        walk(q, 0)
    return rows


@app.command("queues")
def queues_cmd(kubeconfig: Kubeconfig = None, output: Output = "table") -> None:
    """The queue tree: weight, guarantee, limit, usage, fair share, borrowed, lent, pending, admitted (GPUs)."""
    (queues,) = _read(kubeconfig, (QUEUES, None))
    cols = ["name", "weight", "guarantee", "limit", "usage", "fair_share", "borrowed", "lent", "pending", "admitted"]
    _emit(queue_rows(queues), output, cols, ["valid", "namespaces", "message"])


def _queue_of(pod: dict, by_namespace: dict[str, str]) -> str | None:
    meta = pod["metadata"]
    return (meta.get("labels") or {}).get(QUEUE_LABEL) or by_namespace.get(meta.get("namespace", ""))


def _scheduled_condition(pod: dict) -> dict:
    conds = pod.get("status", {}).get("conditions") or []
    return next((c for c in conds if c.get("type") == "PodScheduled"), {})


def workload_rows(pods: list[dict], queues: list[dict], queue: str | None, scheduler: str) -> list[dict[str, Any]]:
    by_namespace = queue_map(queue_entries(queues)[0]).serving  # the controller's rule, not the last listed
    rows = []
    for pod in pods:
        spec, meta = pod.get("spec", {}), pod["metadata"]
        if spec.get("schedulerName") != scheduler:
            continue
        q = _queue_of(pod, by_namespace)
        if queue is not None and q != queue:
            continue
        phase = pod.get("status", {}).get("phase", "Pending")
        cond = _scheduled_condition(pod)
        message = cond.get("message", "") if cond.get("status") == "False" else ""
        position = _POSITION.search(message)
        estimate = _ESTIMATE.search(message)
        if spec.get("nodeName"):
            state = "Running" if phase == "Running" else ("Admitted" if phase == "Pending" else phase)
        else:
            state = "Pending"
        rows.append({
            "namespace": meta.get("namespace"), "name": meta["name"], "queue": q, "state": state,
            "position": f"{position[1]}/{position[2]}" if position else None,
            "estimated_start": estimate[1] if estimate else None, "node": spec.get("nodeName"),
            "reason": cond.get("reason") if message else None,
        })  # fmt: skip
    return sorted(rows, key=lambda w: (w["queue"] or "", w["state"] != "Pending", w["namespace"], w["name"]))


@app.command("workloads")
def workloads_cmd(
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="Only this namespace.")] = None,
    all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A", help="Every namespace.")] = False,
    queue: Annotated[str | None, typer.Option(help="Only this queue.")] = None,
    scheduler_name: Annotated[str, typer.Option(help="Pods with this spec.schedulerName.")] = "fairgpu",
    kubeconfig: Kubeconfig = None,
    output: Output = "table",
) -> None:
    """Pods of fairgpu: queue, state, position in their queue and estimated start (from the controller)."""
    if namespace and all_namespaces:
        raise fail("give --namespace or --all-namespaces, not both")
    ns = None if all_namespaces else (namespace or _current_namespace(kubeconfig))
    pods, queues = _read(kubeconfig, (PODS, ns), (QUEUES, None))
    if queue is not None and queue not in {q["metadata"]["name"] for q in queues}:
        raise fail(f"--queue: {queue!r} is not a queue")
    cols = ["namespace", "name", "queue", "state", "position", "estimated_start"]
    _emit(workload_rows(pods, queues, queue, scheduler_name), output, cols, ["node", "reason"])


def _current_namespace(kubeconfig: str | None) -> str:
    """The namespace of the kubeconfig's current context, as kubectl picks it ("default" when unset)."""
    path = resolve_kubeconfig(kubeconfig)
    if path is None:
        return "default"
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return "default"
    current = doc.get("current-context")
    ctx = next((c.get("context") or {} for c in doc.get("contexts") or [] if c.get("name") == current), {})
    return ctx.get("namespace") or "default"


@app.command("why")
def why_cmd(
    pod: Annotated[str, typer.Argument(help="POD or NAMESPACE/POD.")],
    namespace: Annotated[str | None, typer.Option("--namespace", "-n")] = None,
    kubeconfig: Kubeconfig = None,
    output: Output = "table",
) -> None:
    """Why a pod waits: the engine's explanation, as the controller wrote it to the pod's PodScheduled condition."""
    ns, _, name = pod.rpartition("/")
    ns = ns or namespace or _current_namespace(kubeconfig)
    (pods,) = _read(kubeconfig, (PODS, ns))
    obj = next((p for p in pods if p["metadata"]["name"] == name), None)
    if obj is None:
        raise fail(f"pod {ns}/{name} not found")
    cond = _scheduled_condition(obj)
    node = obj.get("spec", {}).get("nodeName")
    if node:
        lines = [f"pod {ns}/{name}: scheduled on {node}"]
    elif cond.get("status") == "False" and cond.get("message"):
        lines = cond["message"].split("; ")
    else:
        lines = [f"pod {ns}/{name}: pending, no explanation yet (is it for scheduler fairgpu, and is it running?)"]
    if output in ("json", "yaml"):
        _emit([{"namespace": ns, "name": name, "node": node, "explanation": lines}], output, [], [])
        return
    for line in lines:
        typer.echo(line)


def gpu_rows(nodes: list[dict], pods: list[dict]) -> list[dict[str, Any]]:
    """One row per (GPU, pod on it), plus each GPU's totals, from HAMi's node and pod annotations."""
    users: dict[str, list[tuple[str, hami.DeviceUse]]] = defaultdict(list)
    for pod in pods:
        ann = pod["metadata"].get("annotations") or {}
        if not ann.get(hami.ALLOCATED) or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        key = f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}"
        try:
            containers = hami.decode_devices(ann[hami.ALLOCATED])
        except FormatError:
            continue  # not ours to judge here; the controller reports it
        for dev in (d for c in containers for d in c):
            users[dev.uuid].append((key, dev))
    rows = []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        register = (node["metadata"].get("annotations") or {}).get(hami.NODE_REGISTER)
        if not register:
            continue
        try:
            gpus = hami.decode_register(register)
        except FormatError:
            continue
        for gpu in gpus:
            on = users.get(gpu.uuid, [])
            cores = sum(d.cores for _, d in on)
            mem = sum(d.memory_mib for _, d in on)
            rows.append({
                "node": node["metadata"]["name"], "gpu": gpu.index, "uuid": gpu.uuid, "model": gpu.model,
                "pods": len(on), "cores": f"{cores}/{gpu.cores}", "memory": f"{mem}/{gpu.memory_mib}Mi",
                "cores_used": cores, "memory_used_mib": mem, "healthy": gpu.healthy,
                "by_pod": [{"pod": k, "cores": d.cores, "memory_mib": d.memory_mib} for k, d in on],
            })  # fmt: skip
    return rows


@app.command("top")
def top_cmd(
    what: Annotated[str, typer.Argument(help="gpus or nodes")],
    kubeconfig: Kubeconfig = None,
    output: Output = "table",
) -> None:
    """GPU cores and memory in use, per GPU (with the pods on it) or per node, from HAMi's annotations."""
    if what not in ("gpus", "nodes"):
        raise fail(f"top: {what!r} must be gpus or nodes")
    nodes, pods = _read(kubeconfig, (NODES, None), (PODS, None))
    rows = gpu_rows(nodes, pods)
    if what == "gpus":
        if output in ("table", "wide"):
            for row in rows:
                row["by_pod"] = ", ".join(f"{p['pod']} ({p['cores']}%, {p['memory_mib']}Mi)" for p in row["by_pod"])
        _emit(rows, output, ["node", "gpu", "model", "pods", "cores", "memory", "by_pod"], ["uuid", "healthy"])
        return
    per_node: dict[str, dict[str, Any]] = {}
    for row in rows:
        n = per_node.setdefault(row["node"], {"node": row["node"], "gpus": 0, "busy_gpus": 0, "pods": set(),
                                              "cores": 0, "cores_total": 0, "memory_mib": 0})  # fmt: skip
        n["gpus"] += 1
        n["busy_gpus"] += bool(row["pods"])
        n["pods"].update(p["pod"] for p in row["by_pod"])
        n["cores"] += row["cores_used"]
        n["cores_total"] += int(row["cores"].split("/")[1])
        n["memory_mib"] += row["memory_used_mib"]
    out = [
        {**{k: v for k, v in n.items() if k != "cores_total"}, "pods": len(n["pods"]),
         "cores": f"{n['cores']}/{n['cores_total']}"}
        for n in per_node.values()
    ]  # fmt: skip
    _emit(out, output, ["node", "gpus", "busy_gpus", "pods", "cores", "memory_mib"], [])


def main() -> None:  # the kubectl-fairgpu console script
    app()
