"""HAMi's annotation formats (design/hami-interop.md §2–3): node inventory, per-pod device strings, node lock.

Pure functions: encode what fairgpu decided so HAMi's device plugin enforces it, and decode what is already
on the cluster so a restarted scheduler rebuilds its state.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from fairgpu.errors import FormatError
from fairgpu.model import PodSpec
from fairgpu.state import ClusterState, Placement

log = logging.getLogger(__name__)

NODE_REGISTER = "hami.io/node-nvidia-register"
DEVICE_CORDON = "hami.io/device-cordon"
NODE_LOCK = "hami.io/mutex.lock"
VGPU_NODE = "hami.io/vgpu-node"
VGPU_TIME = "hami.io/vgpu-time"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
ALLOCATED = "hami.io/vgpu-devices-allocated"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
LOCK_EXPIRY = timedelta(minutes=5)  # HAMi's default nodeLockExpire
LABEL_MAX = 63
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def label_value(value: str) -> str:
    """`value` as a valid label value (63 characters at most): unchanged when it is one, else its first
    characters and a hash of the whole, so distinct node names stay distinct. The annotation keeps it whole."""
    if len(value) <= LABEL_MAX and _LABEL_VALUE.fullmatch(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:10]
    head = re.sub(r"[^-A-Za-z0-9_.]", "-", value)[: LABEL_MAX - len(digest) - 1].strip("-_.")
    return f"{head}-{digest}" if head else digest


@dataclass(slots=True, frozen=True)
class RegisteredGpu:
    uuid: str
    count: int  # tasks the card may hold (deviceSplitCount)
    memory_mib: int
    cores: int
    model: str
    numa: int = 0
    healthy: bool = False
    index: int = 0
    mode: str = "hami-core"


def decode_register(value: str) -> list[RegisteredGpu]:
    """`hami.io/node-nvidia-register`: JSON (v2.8+) when it starts with `[`, else the legacy text format."""
    text = value.strip()
    if text.startswith("["):
        try:
            devices = json.loads(text)
            return [_json_device(d) for d in devices]
        except (ValueError, KeyError, TypeError) as err:
            raise FormatError(f"{NODE_REGISTER}: not a HAMi device list ({err})") from err
    out = []
    for chunk in (c for c in text.split(":") if c.strip()):
        fields = chunk.split(",")
        if len(fields) not in (7, 9):
            raise FormatError(f"{NODE_REGISTER}: device {chunk!r} has {len(fields)} fields, expected 7 or 9")
        try:
            out.append(
                RegisteredGpu(
                    uuid=fields[0],
                    count=int(fields[1]),
                    memory_mib=int(fields[2]),
                    cores=int(fields[3]),
                    model=fields[4],
                    numa=int(fields[5]),
                    healthy=fields[6].strip().lower() == "true",
                    index=int(fields[7]) if len(fields) == 9 else 0,
                    mode=fields[8] if len(fields) == 9 else "hami-core",
                )
            )
        except ValueError as err:
            raise FormatError(f"{NODE_REGISTER}: device {chunk!r}: {err}") from err
    return out


def _json_device(d: dict) -> RegisteredGpu:
    # Every field is omitempty in HAMi's encoder: a missing health means unhealthy, index/numa mean 0.
    return RegisteredGpu(
        uuid=str(d["id"]),
        count=int(d["count"]),
        memory_mib=int(d["devmem"]),
        cores=int(d.get("devcore", 100)),
        model=str(d["type"]),
        numa=int(d.get("numa", 0)),
        healthy=bool(d.get("health", False)),
        index=int(d.get("index", 0)),
        mode=str(d.get("mode", "hami-core")),
    )


def encode_register(devices: list[RegisteredGpu]) -> str:
    """The v2.8+ JSON form, omitempty like HAMi's encoder (used by tests and the fake device plugin)."""
    out = []
    for d in devices:
        item: dict = {"id": d.uuid, "count": d.count, "devmem": d.memory_mib, "devcore": d.cores, "type": d.model}
        if d.index:
            item["index"] = d.index
        if d.numa:
            item["numa"] = d.numa
        item["mode"] = d.mode
        if d.healthy:
            item["health"] = True
        out.append(item)
    return json.dumps(out, separators=(",", ":"))


@dataclass(slots=True, frozen=True)
class DeviceUse:
    uuid: str
    vendor: str
    memory_mib: int
    cores: int


def encode_devices(containers: list[list[DeviceUse]]) -> str:
    """One `;`-terminated segment per container (init containers first), empty for containers with no GPU."""
    return "".join("".join(f"{d.uuid},{d.vendor},{d.memory_mib},{d.cores}:" for d in c) + ";" for c in containers)


def decode_devices(value: str) -> list[list[DeviceUse]]:
    """Inverse of encode_devices; keeps empty segments and tolerates a missing trailing `;` (Volcano)."""
    segments = value.split(";")
    if segments and segments[-1] == "" and value.endswith(";"):
        segments = segments[:-1]
    out = []
    for seg in segments:
        devices = []
        for dev in (d for d in seg.split(":") if d):
            fields = dev.split(",")
            if len(fields) != 4:
                raise FormatError(f"{ALLOCATED}: device {dev!r} needs uuid,type,mem,cores")
            try:
                devices.append(DeviceUse(fields[0], fields[1], int(fields[2]), int(fields[3])))
            except ValueError as err:
                raise FormatError(f"{ALLOCATED}: device {dev!r}: {err}") from err
        out.append(devices)
    return out


@dataclass(slots=True, frozen=True)
class NodeLock:
    taken: datetime
    namespace: str
    pod: str

    def encode(self) -> str:
        return f"{self.taken.strftime('%Y-%m-%dT%H:%M:%SZ')},{self.namespace},{self.pod}"

    def expired(self, now: datetime) -> bool:
        return now - self.taken > LOCK_EXPIRY


def decode_lock(value: str) -> NodeLock | None:
    """`<RFC3339>,<ns>,<pod>`; None for a value HAMi itself could not parse (it treats those as free)."""
    parts = value.split(",")
    if len(parts) != 3:
        return None
    try:
        taken = datetime.fromisoformat(parts[0].replace("Z", "+00:00"))
    except ValueError:
        return None
    if taken.tzinfo is None:
        taken = taken.replace(tzinfo=UTC)
    return NodeLock(taken, parts[1], parts[2])


def placement_from_annotations(
    state: ClusterState, ni: int, spec: PodSpec, annotations: dict[str, str], key: str
) -> Placement | None:
    """Where a pod bound to node `ni` runs, read from HAMi's allocation record when it names this node's
    cards; a GPU pod bound without one (placed by someone else) takes fitting cards so none is double-booked.
    None if no card fits."""
    if spec.gpu is None:
        return Placement(ni, cpu_m=spec.cpu_m, memory_mib=spec.memory_mib)
    raw = annotations.get(ALLOCATED)
    if raw is not None and annotations.get(VGPU_NODE) == state.node_names[ni]:
        try:
            segments = decode_devices(raw)
        except FormatError as err:
            log.warning("pod %s: %s", key, err)
            segments = []
        devices = [d for seg in segments for d in seg]
        uuids = [g.uuid for g in state.nodes[ni].gpus]
        if devices and all(d.uuid in uuids for d in devices):
            slots = tuple(uuids.index(d.uuid) for d in devices)
            return Placement(
                ni, slots, devices[0].cores, tuple(d.memory_mib for d in devices), spec.cpu_m, spec.memory_mib
            )
    fits = [s for s in range(len(state.nodes[ni].gpus)) if state.fits(state.placement_for(spec, ni, (s,)))]
    if len(fits) < spec.gpu.count:
        return None
    return state.placement_for(spec, ni, fits[: spec.gpu.count])
