"""HAMi's annotation formats (design/hami-interop.md §2–3), decoded as strictly as HAMi v2.10.0's Go code
decodes them: node inventory, per-pod device strings, node lock.

Pure functions: encode what fairgpu decided so HAMi's device plugin enforces it, and decode what is already
on the cluster so a restarted scheduler rebuilds its state. tests/hami_corpus holds HAMi's own test cases
for each of them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from fairgpu.errors import FormatError

NODE_REGISTER = "hami.io/node-nvidia-register"
DEVICE_CORDON = "hami.io/device-cordon"
NODE_LOCK = "hami.io/mutex.lock"
VGPU_NODE = "hami.io/vgpu-node"
VGPU_TIME = "hami.io/vgpu-time"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
ALLOCATED = "hami.io/vgpu-devices-allocated"
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
USE_GPUUUID = "nvidia.com/use-gpuuuid"
NOUSE_GPUUUID = "nvidia.com/nouse-gpuuuid"
USE_GPUTYPE = "nvidia.com/use-gputype"
NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
VGPU_MODE = "nvidia.com/vgpu-mode"
NUMA_BIND = "nvidia.com/numa-bind"
NODE_POLICY = "hami.io/node-scheduler-policy"
GPU_POLICY = "hami.io/gpu-scheduler-policy"
SCORING_WEIGHTS = "hami.io/device-scoring-weights"
NODE_SCORE = "hami.io/node-nvidia-score"  # GPU pair scores (topology-aware), written with ENABLE_TOPOLOGY_SCORE
VENDOR = "NVIDIA"  # the type word HAMi's NVIDIA device strings carry
MIG_MODE = "mig"
LOCK_EXPIRY = timedelta(minutes=5)  # HAMi's default NodeLockTimeout (HAMI_NODELOCK_EXPIRE)
LABEL_MAX = 63
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_INT = re.compile(r"^[+-]?[0-9]+$")  # Go's strconv.ParseInt / Atoi: no spaces, no underscores
_GO_BOOL = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True}
_GO_BOOL |= {"0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}
_INT32 = (-(2**31), 2**31 - 1)


def _go_int(text: str, what: str, bits32: bool = True) -> int:
    if not _INT.match(text):
        raise FormatError(f"invalid {what} field: {text!r} is not an integer")
    value = int(text)
    if bits32 and not _INT32[0] <= value <= _INT32[1]:
        raise FormatError(f"invalid {what} field: {text!r} is out of range")
    return value


@dataclass(slots=True, frozen=True)
class MigProfile:
    name: str
    memory_mib: int
    cores: int
    slices: int
    placements: tuple[tuple[int, int], ...] = ()  # (start, size)


@dataclass(slots=True, frozen=True)
class RegisteredGpu:
    uuid: str
    count: int  # tasks the card may hold (deviceSplitCount)
    memory_mib: int
    cores: int  # devcore: 100 × deviceCoreScaling
    model: str
    numa: int = 0
    healthy: bool = False
    index: int = 0
    mode: str = "hami-core"
    mig_profiles: tuple[MigProfile, ...] = field(default=())


def decode_register(value: str) -> list[RegisteredGpu]:
    """`hami.io/node-nvidia-register`: JSON (v2.8+, `UnMarshalNodeDevices`) when it starts with `[`, else
    the legacy text format (`DecodeNodeDevices`, still what v2.7 device plugins write)."""
    text = value.strip()
    if text.startswith("[") or text == "null":
        return _decode_json(text)
    return _decode_legacy(value)


def _decode_legacy(value: str) -> list[RegisteredGpu]:
    if ":" not in value:
        raise FormatError(f"{NODE_REGISTER}: node annotation missing device separator")
    out = []
    for chunk in value.split(":"):
        if chunk == "":
            continue
        if "," not in chunk:
            raise FormatError(f"{NODE_REGISTER}: malformed node annotation segment: {chunk!r}")
        f = chunk.split(",")
        if len(f) not in (7, 9):
            raise FormatError(f"{NODE_REGISTER}: unexpected field count {len(f)} in node annotation")
        count, mem, cores = _go_int(f[1], "count"), _go_int(f[2], "memory"), _go_int(f[3], "core")
        if f[6] not in _GO_BOOL:
            raise FormatError(f"{NODE_REGISTER}: invalid health field: {f[6]!r} is not a boolean")
        numa = _go_int(f[5], "numa", bits32=False)
        index, mode = 0, "hami-core"
        if len(f) == 9:
            index, mode = _go_int(f[7], "index", bits32=False), f[8]
            if index < 0:
                raise FormatError(f"{NODE_REGISTER}: index field must not be negative: {index}")
        out.append(RegisteredGpu(f[0], count, mem, cores, f[4], numa, _GO_BOOL[f[6]], index, mode))
    return out


def _decode_json(text: str) -> list[RegisteredGpu]:
    try:
        devices = json.loads(text)
    except ValueError as err:
        raise FormatError(f"{NODE_REGISTER}: not JSON ({err})") from err
    if devices is None:
        return []
    if not isinstance(devices, list):
        raise FormatError(f"{NODE_REGISTER}: not a JSON list of devices")
    return [_json_device(d, i) for i, d in enumerate(devices)]


_MISSING = object()
T = TypeVar("T")


def _field(d: dict, key: str, kind: type[T], default: T, where: str) -> T:
    """One DeviceInfo field as Go's encoding/json fills it: keys match case-insensitively (an exact match
    first), null and absent leave the zero value, and a value of another type is an error."""
    hit = d.get(key, _MISSING)
    if hit is _MISSING:
        hit = next((v for k, v in d.items() if k.lower() == key.lower()), None)
    if hit is None:
        return default
    if kind is int and (isinstance(hit, bool) or not isinstance(hit, int)):
        raise FormatError(f"{NODE_REGISTER}: {where}.{key}: {hit!r} is not an integer")
    if not isinstance(hit, kind):
        raise FormatError(f"{NODE_REGISTER}: {where}.{key}: {hit!r} is not a {kind.__name__}")
    return hit


def _json_device(d: object, i: int) -> RegisteredGpu:
    # Every field is omitempty in HAMi's encoder: a missing health means unhealthy, index/numa mean 0, a
    # missing mode is "" (HAMi's Fit treats it as a non-MIG card).
    where = f"[{i}]"
    if not isinstance(d, dict):
        raise FormatError(f"{NODE_REGISTER}: {where} is not a device object")
    index = _field(d, "index", int, 0, where)
    if index < 0:
        raise FormatError(f"{NODE_REGISTER}: {where}.index: {index} is negative (Go: uint)")
    ints = {k: _field(d, k, int, 0, where) for k in ("count", "devmem", "devcore")}
    for k, v in ints.items():
        if not _INT32[0] <= v <= _INT32[1]:
            raise FormatError(f"{NODE_REGISTER}: {where}.{k}: {v} overflows int32")
    profiles = _field(d, "migProfiles", list, [], where)
    return RegisteredGpu(
        uuid=_field(d, "id", str, "", where),
        count=ints["count"],
        memory_mib=ints["devmem"],
        cores=ints["devcore"],
        model=_field(d, "type", str, "", where),
        numa=_field(d, "numa", int, 0, where),
        healthy=_field(d, "health", bool, False, where),
        index=index,
        mode=_field(d, "mode", str, "", where),
        mig_profiles=tuple(_mig_profile(p, f"{where}.migProfiles[{j}]") for j, p in enumerate(profiles)),
    )


def _mig_profile(p: object, where: str) -> MigProfile:
    if not isinstance(p, dict):
        raise FormatError(f"{NODE_REGISTER}: {where} is not a MIG profile object")
    places = [x for x in _field(p, "placements", list, [], where) if isinstance(x, dict)]
    return MigProfile(
        _field(p, "name", str, "", where),
        _field(p, "memoryMB", int, 0, where),
        _field(p, "core", int, 0, where),
        _field(p, "sliceCount", int, 0, where),
        tuple((_field(x, "start", int, 0, where), _field(x, "size", int, 0, where)) for x in places),
    )


def decode_pair_scores(value: str) -> dict[str, dict[str, int]]:
    """`hami.io/node-nvidia-score` (`DecodePairScores`: JSON `[{"uuid": …, "score": {uuid: int}}]`) as card →
    (other card → score); the first entry of a card wins, as HAMi's GetNodeDevices takes it. Raises FormatError
    where Go's json.Unmarshal fails (HAMi then drops the node's devices)."""
    try:
        entries = json.loads(value)
    except ValueError as err:
        raise FormatError(f"{NODE_SCORE}: not JSON ({err})") from err
    if not isinstance(entries, list | None):
        raise FormatError(f"{NODE_SCORE}: not a JSON list of pair scores")
    out: dict[str, dict[str, int]] = {}
    for i, e in enumerate(entries or []):
        if e is None:
            continue
        if not isinstance(e, dict):
            raise FormatError(f"{NODE_SCORE}: [{i}] is not an object")
        uuid = next((v for k, v in e.items() if k.lower() == "uuid"), None) if "uuid" not in e else e["uuid"]
        scores = next((v for k, v in e.items() if k.lower() == "score"), None) if "score" not in e else e["score"]
        if not isinstance(uuid, str | None) or not isinstance(scores, dict | None):
            raise FormatError(f"{NODE_SCORE}: [{i}] needs a string uuid and a score object")
        scores = {k: 0 if v is None else v for k, v in (scores or {}).items()}  # Go: null is the zero value
        bad = [v for v in scores.values() if type(v) is not int or not -(2**63) <= v < 2**63]
        if bad:
            raise FormatError(f"{NODE_SCORE}: [{i}].score: {bad[0]!r} is not an integer")
        out.setdefault(uuid or "", scores)
    return out


def encode_register(devices: list[RegisteredGpu]) -> str:
    """The v2.8+ JSON form byte for byte as Go's json.Marshal of DeviceInfo writes it (MarshalNodeDevices):
    fields in struct order, zero values omitted."""
    out = []
    for d in devices:
        item: dict = {"id": d.uuid, "index": d.index, "count": d.count, "devmem": d.memory_mib}
        item |= {"devcore": d.cores, "type": d.model, "numa": d.numa, "mode": d.mode}
        if d.mig_profiles:
            item["migProfiles"] = [
                {
                    "name": p.name,
                    "memoryMB": p.memory_mib,
                    "core": p.cores,
                    "sliceCount": p.slices,
                    "placements": [{"start": s, "size": z} for s, z in p.placements],
                }
                for p in d.mig_profiles
            ]
        item["health"] = d.healthy
        out.append({k: v for k, v in item.items() if v not in (0, "", False) or isinstance(v, list)})
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


@dataclass(slots=True, frozen=True)
class MigAllocation:
    """One entry of `hami.io/vgpu-mig-allocations` (pkg/device/nvidia/mig_allocations.go `MigAllocation`): the
    MIG instance the scheduler reserved for device `device` of container `container` (init containers first)."""

    container: int
    device: int
    gpu: str
    profile: str
    start: int
    size: int


def encode_mig_allocations(allocations: list[MigAllocation]) -> str:
    """`EncodeMigAllocations`: Go's json.Marshal of []MigAllocation, runtime fields (omitempty) left out."""
    return json.dumps(
        [
            {"containerIndex": a.container, "deviceIndex": a.device, "gpuUUID": a.gpu, "profile": a.profile,
             "placement": {"start": a.start, "size": a.size}}
            for a in allocations
        ],
        separators=(",", ":"),
    )  # fmt: skip


def decode_mig_allocations(value: str) -> list[MigAllocation]:
    """`DecodeMigAllocations`: "" is none; an entry without container/device index, GPU, profile or a
    placement size, a partial runtime identity, or a repeated (container, device) is an error."""
    if value == "":
        return []
    try:
        raw = json.loads(value)
    except ValueError as err:
        raise FormatError(f"{MIG_ALLOCATIONS}: not JSON ({err})") from err
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise FormatError(f"{MIG_ALLOCATIONS}: not a JSON list")
    out: list[MigAllocation] = []
    seen: set[tuple[int, int]] = set()
    for i, a in enumerate(raw):
        where = f"{MIG_ALLOCATIONS}[{i}]"
        if not isinstance(a, dict):
            raise FormatError(f"{where}: not an object")
        place = _field(a, "placement", dict, {}, where)
        entry = MigAllocation(
            _field(a, "containerIndex", int, 0, where), _field(a, "deviceIndex", int, 0, where),
            _field(a, "gpuUUID", str, "", where), _field(a, "profile", str, "", where),
            _field(place, "start", int, 0, where), _field(place, "size", int, 0, where),
        )  # fmt: skip
        if entry.container < 0 or entry.device < 0 or not entry.gpu or not entry.profile or entry.size == 0:
            raise FormatError(f"MIG allocation {i} is incomplete")
        runtime = sum(_field(a, k, object, None, where) not in (None, "") for k in ("migUUID", "gpuInstanceID",
                      "computeInstanceID"))  # fmt: skip
        if runtime not in (0, 3):
            raise FormatError(f"MIG allocation {i} has partial runtime identity")
        if (entry.container, entry.device) in seen:
            raise FormatError(f"duplicate MIG allocation for container {entry.container} device {entry.device}")
        seen.add((entry.container, entry.device))
        out.append(entry)
    return out


@dataclass(slots=True, frozen=True)
class DeviceUse:
    uuid: str
    vendor: str
    memory_mib: int
    cores: int


def encode_devices(containers: list[list[DeviceUse]]) -> str:
    """One `;`-terminated segment per container (init containers first), empty for containers with no GPU
    (`EncodePodSingleDevice`)."""
    return "".join("".join(f"{d.uuid},{d.vendor},{d.memory_mib},{d.cores}:" for d in c) + ";" for c in containers)


def decode_devices(value: str) -> list[list[DeviceUse]]:
    """`DecodePodDevices` for one device type: a segment per `;`-separated part, kept even when empty (so the
    trailing `;` yields one more, empty segment, as in HAMi); entries without a comma are skipped, entries
    with fewer than 4 fields are an error, extra fields are ignored."""
    out = []
    for seg in value.split(";"):
        devices = []
        for dev in seg.split(":") if seg else ():
            if "," not in dev:
                continue
            f = dev.split(",")
            if len(f) < 4:
                raise FormatError(f"{ALLOCATED}: device {dev!r}: missing fields (needs uuid,type,mem,cores)")
            devices.append(DeviceUse(f[0], f[1], _go_int(f[2], "memory"), _go_int(f[3], "core")))
        out.append(devices)
    return out


# Go's time.Parse(time.RFC3339, …): a full date and time, optional fraction, and a zone (Z or ±hh:mm).
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


@dataclass(slots=True, frozen=True)
class NodeLock:
    taken: datetime
    namespace: str  # "" for a legacy timestamp-only lock
    pod: str

    def encode(self) -> str:
        return f"{self.taken.strftime('%Y-%m-%dT%H:%M:%SZ')},{self.namespace},{self.pod}"

    def expired(self, now: datetime, expiry: timedelta = LOCK_EXPIRY) -> bool:
        return now - self.taken > expiry


def decode_lock(value: str) -> NodeLock:
    """`ParseNodeLock`: `<RFC3339>,<ns>,<pod>`, or a legacy bare `<RFC3339>`. Raises FormatError for anything
    else: HAMi then refuses to take the lock, so an unparsable lock is held, not free."""
    if "," in value:
        parts = value.split(",")
        if len(parts) != 3:
            raise FormatError(f"{NODE_LOCK}: malformed lock {value!r}: expected 3 parts, got {len(parts)}")
        stamp, ns, pod = parts
    else:
        stamp, ns, pod = value, "", ""
    if not _RFC3339.match(stamp):
        raise FormatError(f"{NODE_LOCK}: {stamp!r} is not an RFC 3339 time")
    try:
        taken = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError as err:
        raise FormatError(f"{NODE_LOCK}: {stamp!r}: {err}") from err
    return NodeLock(taken.astimezone(UTC), ns, pod)


def go_bool(text: str) -> bool | None:
    """strconv.ParseBool; None where Go answers an error."""
    return _GO_BOOL.get(text)


def uuid_list(value: str) -> tuple[str, ...]:
    """`CheckUUID`/`CheckType` lists: comma-separated, trimmed; an empty value means no constraint."""
    return tuple(u.strip() for u in value.split(",") if u.strip())


def label_value(value: str) -> str:
    """`value` as a valid label value (63 characters at most): unchanged when it is one, else its first
    characters and a hash of the whole, so distinct node names stay distinct. The annotation keeps it whole."""
    if len(value) <= LABEL_MAX and _LABEL_VALUE.fullmatch(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:10]
    head = re.sub(r"[^-A-Za-z0-9_.]", "-", value)[: LABEL_MAX - len(digest) - 1].strip("-_.")
    return f"{head}-{digest}" if head else digest
