"""CarryOut's record of binds that landed before the pod cache shows them (k8s/carryout.py), without an API
server: a landed bind is known by the pod's UID, so a pod made again under the name is another pod, and the
record goes once the cache shows the bound pod, a new one, or none. A wrong answer here books a GPU twice (a
bound pod taken for pending is placed again) or never schedules a pod (a new pod taken for the bound one)."""

from __future__ import annotations

import asyncio
import types

from tests.conftest import gpu_node, whole

from fairgpu.catalog import load_profile
from fairgpu.errors import BindError, KubeError
from fairgpu.framework.interfaces import Evict
from fairgpu.framework.scheduler import Scheduler
from fairgpu.k8s import hami
from fairgpu.k8s.binder import device_string
from fairgpu.k8s.carryout import CarryOut, Stats
from fairgpu.k8s.parsed import ParsedPods
from fairgpu.k8s.translate import pod_info
from fairgpu.k8s.writes import Writes
from fairgpu.model import QueueSpec, QueueTree

KEY = "ns/p"


def _obj(uid: str, node: str | None = None, phase: str = "Pending", alloc: str = "") -> dict:
    spec: dict = {
        "schedulerName": "fairgpu",
        "containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    }
    if node is not None:
        spec["nodeName"] = node
    meta = {"name": "p", "namespace": "ns", "uid": uid, "annotations": {hami.ALLOCATED: alloc} if alloc else {}}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


class _Binder:
    def __init__(self, fails: bool) -> None:
        self.fails = fails

    async def bind(self, *args: object) -> None:
        if self.fails:
            raise BindError("no answer")


class _Port:
    """What the API server answers when a failed bind is read back."""

    def __init__(self, answer: dict) -> None:
        self.answer = answer
        self.evicted: list[tuple[str, str | None]] = []
        self.refuse: dict[str, int] = {}  # pod name -> the status its eviction is answered with

    async def get(self, kind: object, name: str, namespace: str) -> dict:
        return self.answer

    async def evict(self, namespace: str, name: str, grace: int, uid: str | None) -> None:
        self.evicted.append((name, uid))
        code = self.refuse.get(name)
        if code is not None:
            raise KubeError(code, "Refused", name)


class _Reporter:
    def scheduled(self, key: str, uid: str, node: str) -> None:
        pass

    def preempted(self, key: str, reason: str) -> None:
        pass


def _carry(cache: dict[str, dict], fails: bool = False, answer: dict | None = None) -> CarryOut:
    parsed = ParsedPods()
    carry = CarryOut(_Port(answer or {}), _Reporter(), parsed, cache.get, lambda: 60.0, lambda: None, Stats(), {}, None)  # type: ignore[arg-type]
    engine = Scheduler([gpu_node("n0", gpus=1)], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    carry.engine, carry.binder = engine, _Binder(fails)  # type: ignore[assignment]
    return carry


def _bound(carry: CarryOut, cache: dict[str, dict], now: dict | None) -> bool:
    """is_bound once the cache (and the parsed pods) show `now` for the pod (None: gone)."""
    if now is None:
        cache.pop(KEY, None)
    else:
        cache[KEY] = now
    carry.parsed.read(cache, {KEY})
    return carry.is_bound(KEY)


def _land(carry: CarryOut, cache: dict[str, dict]) -> None:
    carry.parsed.read(cache, {KEY})
    placement = carry.engine.state.placement_for(whole(1), 0, (0,))  # type: ignore[union-attr]
    asyncio.run(carry._bind("w", KEY, placement))


def test_without_a_landed_bind_a_pod_is_bound_only_where_the_cache_shows_it_running():
    cache = {KEY: _obj("u1")}
    carry = _carry(cache)
    assert not _bound(carry, cache, _obj("u1"))  # pending
    assert _bound(carry, cache, _obj("u1", node="n0", phase="Running"))
    assert not _bound(carry, cache, _obj("u1", node="n0", phase="Succeeded"))  # finished: its room is free
    assert not _bound(carry, cache, None)


def test_a_landed_bind_holds_for_its_pod_until_the_cache_shows_it_and_never_for_a_pod_made_again():
    cache = {KEY: _obj("u1")}
    carry = _carry(cache)
    _land(carry, cache)
    assert carry.stats.binds == 1
    assert _bound(carry, cache, _obj("u1"))  # the cache lags: still pending there, bound in truth
    assert not carry.quiet()  # the cache does not show what runs yet
    assert _bound(carry, cache, None)  # not parsed (a relist under way): the bind still holds
    assert not _bound(carry, cache, _obj("u2"))  # deleted and made again under the name: another pod, pending
    assert carry.quiet()  # and the record of the old pod's bind is gone


def test_the_record_of_a_landed_bind_goes_once_the_cache_shows_the_pod_bound_or_gone():
    for now in (_obj("u1", node="n0", phase="Running"), None):
        cache = {KEY: _obj("u1")}
        carry = _carry(cache)
        _land(carry, cache)
        assert not carry.quiet()
        if now is None:
            del cache[KEY]
        else:
            cache[KEY] = now
        assert carry.quiet()


def test_a_failed_bind_read_back_bound_by_us_is_landed_and_one_read_back_unbound_is_not():
    """The Binding's answer was lost: the pod read back on our node with our allocation counts as landed (bound,
    one bind); read back unbound, the bind failed and the pod is not bound."""
    cache = {KEY: _obj("u1")}
    carry = _carry(cache, fails=True)
    placement = carry.engine.state.placement_for(whole(1), 0, (0,))  # type: ignore[union-attr]
    ours = [
        hami.DeviceUse("GPU-n0-0", hami.VENDOR, m, c) for c, m in zip(placement.cores, placement.mem_mib, strict=True)
    ]
    carry.port.answer = _obj("u1", node="n0", alloc=device_string(pod_info(cache[KEY]), ours, placement.segments))
    _land(carry, cache)
    assert (carry.is_bound(KEY), carry.stats.binds, carry.stats.bind_failures) == (True, 1, 1)
    cache = {KEY: _obj("u1")}
    carry = _carry(cache, fails=True, answer=_obj("u1"))
    _land(carry, cache)
    assert (carry.is_bound(KEY), carry.stats.binds, carry.stats.bind_failures) == (False, 0, 1)


def test_an_eviction_goes_on_past_a_victim_gone_or_made_again_and_stops_at_a_refusal():
    """A workload of pods a and b is evicted in turn, each with the UID the engine chose. a answered 404 (gone)
    or 409 (the UID precondition: a new pod of that name) is what an eviction wants: b is evicted next. a
    refused (429, a PodDisruptionBudget) stops it: b keeps running, and the workload is out of choice a while."""
    for code, evicted, refused in ((404, 1, False), (409, 1, False), (429, 0, True)):
        carry = _carry({})
        carry.writes = Writes()
        carry.book = types.SimpleNamespace(  # type: ignore[assignment]
            members={"w": ("ns/a", "ns/b")}, uids={"ns/a": "ua", "ns/b": "ub"}, shrinking={}
        )
        carry.port.refuse["a"] = code  # type: ignore[attr-defined]
        asyncio.run(carry._evict(Evict("w", "reclaim"), 30))
        sent = [("a", "ua"), ("b", "ub")] if not refused else [("a", "ua")]
        assert carry.port.evicted == sent, code  # type: ignore[attr-defined]
        assert (carry.stats.evictions, bool(carry._refusals)) == (evicted, refused), code
