"""The fake kube-apiserver is honest: the same contract through kubernetes-asyncio's typed client, through
kubectl (client-go), and through fairgpu's own port (design/fake-apiserver.md §9)."""

from __future__ import annotations

import asyncio
import json
import select
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config

from fairgpu.errors import KubeError
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.informer import Informer
from fairgpu.k8s.port import NODES, PODS, Kind


def pod(name: str, ns: str = "default", labels: dict | None = None, **spec) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec},
    }


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def typed(fake_api, tmp_path):
    return await config.new_client_from_config(config_file=fake_api.kubeconfig(str(tmp_path / "kc")))


async def read_watch(resp, n: int, timeout: float = 5.0) -> list[dict]:
    out = []
    async with asyncio.timeout(timeout):
        while len(out) < n:
            line = await resp.content.readline()
            if not line:
                break
            out.append(json.loads(line))
    return out


# -- kubernetes-asyncio, typed client ---------------------------------------------------------------------
def test_typed_client_crud_bind_and_status_reply(fake_api, tmp_path):
    async def go():
        api = await typed(fake_api, tmp_path)
        v1 = client.CoreV1Api(api)
        created = await v1.create_namespaced_pod("default", pod("p1"))
        assert created.metadata.uid and created.metadata.resource_version
        assert created.status.phase == "Pending"
        with pytest.raises(client.ApiException) as err:
            await v1.create_namespaced_pod("default", pod("p1"))
        assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "AlreadyExists"
        # strategic merge patch is what the typed client sends for a dict
        patched = await v1.patch_namespaced_pod("p1", "default", {"metadata": {"annotations": {"a": "1"}}})
        assert patched.metadata.annotations == {"a": "1"}
        assert int(patched.metadata.resource_version) > int(created.metadata.resource_version)
        # stale resourceVersion in a patch is a precondition → 409 Conflict
        stale = {"metadata": {"resourceVersion": created.metadata.resource_version, "annotations": {"b": "2"}}}
        with pytest.raises(client.ApiException) as err:
            await v1.patch_namespaced_pod("p1", "default", stale)
        assert err.value.status == 409 and "the object has been modified" in json.loads(err.value.body)["message"]
        # binding answers a Status, not a Binding: read it raw
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name="p1", uid=created.metadata.uid),
            target=client.V1ObjectReference(kind="Node", name="n1"),
        )
        resp = await v1.create_namespaced_pod_binding("p1", "default", body, _preload_content=False)
        assert resp.status == 201 and resp.headers["Content-Type"] == "application/json"
        assert (await resp.json())["kind"] == "Status"
        got = await v1.read_namespaced_pod("p1", "default")
        assert got.spec.node_name == "n1"
        assert [c.type for c in got.status.conditions] == ["PodScheduled"]
        with pytest.raises(client.ApiException) as err:
            await v1.create_namespaced_pod_binding("p1", "default", body)
        assert err.value.status == 409 and 'already assigned to node "n1"' in json.loads(err.value.body)["message"]
        # field selectors, Go booleans
        listed = await v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
        assert [p.metadata.name for p in listed.items] == ["p1"]
        with pytest.raises(client.ApiException) as err:
            await v1.list_pod_for_all_namespaces(field_selector="spec.hostname=x")
        assert err.value.status == 400
        await api.close()

    run(go())


def test_binding_preconditions_and_validation(fake_api, tmp_path):
    async def go():
        api = await typed(fake_api, tmp_path)
        v1 = client.CoreV1Api(api)
        await v1.create_namespaced_pod("default", pod("p2"))

        async def bind(meta: dict, target: dict, name: str = "p2") -> tuple[int, dict]:
            body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta, "target": target}
            r = await v1.create_namespaced_pod_binding(name, "default", body, _preload_content=False)
            return r.status, await r.json()

        assert (await bind({"name": "other"}, {"name": "n"}))[0] == 400
        code, status = await bind({"name": "p2"}, {"kind": "Node"})
        assert code == 500 and status["message"] == "target.name: Required value"
        code, status = await bind({"name": "p2", "uid": "not-the-uid"}, {"name": "n"})
        assert code == 409 and "Precondition failed: UID" in status["message"]
        assert (await bind({"name": "ghost"}, {"name": "n"}, name="ghost"))[0] == 404
        await api.close()

    run(go())


def test_watch_semantics_replay_selector_transitions_and_410(fake_api, tmp_path):
    async def go():
        api = await typed(fake_api, tmp_path)
        v1 = client.CoreV1Api(api)
        a = await v1.create_namespaced_pod("default", pod("a"))
        await v1.create_namespaced_pod("default", pod("b"))
        # unset RV: synthetic ADDED for every object
        resp = await v1.list_pod_for_all_namespaces(watch=True, _preload_content=False)
        assert resp.headers["Content-Type"] == "application/json"
        assert [e["type"] for e in await read_watch(resp, 2)] == ["ADDED", "ADDED"]
        resp.close()
        # exact RV: replay only what came after; unassigned-pods watch sees DELETED when its bind lands
        resp = await v1.list_pod_for_all_namespaces(
            watch=True,
            resource_version=a.metadata.resource_version,
            field_selector="spec.nodeName=",
            allow_watch_bookmarks=True,
            _preload_content=False,
        )
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "a"}, "target": {"name": "n1"}}
        await v1.create_namespaced_pod_binding("a", "default", binding, _preload_content=False)
        fake_api.control("bookmark")
        events = await read_watch(resp, 3)
        assert [(e["type"], e["object"]["metadata"].get("name")) for e in events] == [
            ("ADDED", "b"),
            ("DELETED", "a"),
            ("BOOKMARK", None),
        ]
        rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
        assert rvs == sorted(rvs)
        resp.close()
        # compaction: a watch from an old RV gets one in-stream ERROR 410 and the stream closes
        fake_api.control("compact")
        resp = await v1.list_pod_for_all_namespaces(
            watch=True, resource_version=a.metadata.resource_version, _preload_content=False
        )
        events = await read_watch(resp, 2)
        assert len(events) == 1 and events[0]["type"] == "ERROR"
        assert events[0]["object"]["code"] == 410 and events[0]["object"]["reason"] == "Expired"
        await api.close()

    run(go())


def test_lease_optimistic_concurrency_and_microtime(fake_api, tmp_path):
    async def go():
        api = await typed(fake_api, tmp_path)
        coord = client.CoordinationV1Api(api)
        spec = {"holderIdentity": "a", "leaseDurationSeconds": 10, "renewTime": "2026-01-01T00:00:00.000000Z"}
        lease = {"metadata": {"name": "l", "namespace": "kube-system"}, "spec": spec}
        first = await coord.create_namespaced_lease("kube-system", lease)
        with pytest.raises(client.ApiException) as err:
            await coord.create_namespaced_lease("kube-system", lease)
        assert err.value.status == 409
        # The typed client turns renewTime into a datetime and writes it back without microseconds: a real
        # apiserver rejects that, and so does the fake (the trap that broke electors tested on lax fakes).
        first.spec.holder_identity = "b"
        with pytest.raises(client.ApiException) as err:
            await coord.replace_namespaced_lease("l", "kube-system", first)
        assert err.value.status == 400
        rv = first.metadata.resource_version
        update = {"metadata": {"name": "l", "resourceVersion": rv}, "spec": {**spec, "holderIdentity": "b"}}
        await coord.replace_namespaced_lease("l", "kube-system", update)
        update["spec"]["holderIdentity"] = "c"  # same (now stale) resourceVersion
        with pytest.raises(client.ApiException) as err:
            await coord.replace_namespaced_lease("l", "kube-system", update)
        assert err.value.status == 409
        bad = {"metadata": {"name": "m"}, "spec": {**spec, "renewTime": "2026-01-01T00:00:00Z"}}
        with pytest.raises(client.ApiException) as err:
            await coord.create_namespaced_lease("kube-system", bad)
        assert err.value.status == 400 and "cannot parse" in json.loads(err.value.body)["message"]
        zero = {"metadata": {"name": "z"}, "spec": {**spec, "leaseDurationSeconds": 0}}
        with pytest.raises(client.ApiException) as err:
            await coord.create_namespaced_lease("kube-system", zero)
        assert err.value.status == 422
        await api.close()

    run(go())


PDBS = Kind("policy", "v1", "poddisruptionbudgets", True)


def test_eviction_honours_disruption_budgets_and_grace(fake_api, tmp_path):
    """policy/v1 eviction as EvictionREST does it: budgets matched by selector, a budget the disruption
    controller has not processed yet, none left, one used up, several; pending and terminating pods skip
    budgets; the grace period marks a bound pod and the kubelet's grace-0 delete removes it."""

    def raw_evict(name: str, body: dict | None = None) -> tuple[int, dict, str | None]:
        doc = body or {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
        req = urllib.request.Request(
            f"{fake_api.url}/api/v1/namespaces/default/pods/{name}/eviction",
            data=json.dumps(doc).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, json.loads(resp.read()), None
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read()), err.headers.get("Retry-After")

    async def go():
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        ready = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        for name in ("db-0", "db-1", "web-0"):
            app = name.split("-")[0]
            created = await port.create(PODS, pod(name, labels={"app": app}), "default")
            await port.bind("default", name, created["metadata"]["uid"], "n1", {})
            await port.patch(PODS, name, {"status": ready}, "default", subresource="status")
        await port.create(PODS, pod("db-pending", labels={"app": "db"}), "default")
        spec = {"minAvailable": 2, "selector": {"matchLabels": {"app": "db"}}}
        await port.create(PDBS, {"metadata": {"name": "db"}, "spec": spec}, "default")
        with pytest.raises(KubeError) as err:
            await port.create(PDBS, {"metadata": {"name": "both"}, "spec": {**spec, "maxUnavailable": 1}}, "default")
        assert err.value.code == 422

        code, status, retry = await asyncio.to_thread(raw_evict, "db-0")  # no status yet: not processed
        assert (code, status["reason"], retry) == (429, "TooManyRequests", "10")
        assert "still being processed" in status["details"]["causes"][0]["message"]
        budget = {"observedGeneration": 1, "disruptionsAllowed": 0, "currentHealthy": 2, "desiredHealthy": 2}
        await port.patch(PDBS, "db", {"status": budget}, "default", subresource="status")
        code, status, retry = await asyncio.to_thread(raw_evict, "db-0")
        assert (code, retry) == (429, None) and status["message"].startswith("Cannot evict pod as it would violate")
        assert status["details"]["causes"] == [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget db needs 2 healthy pods and has 2 currently",
            }
        ]
        await port.evict("default", "db-pending")  # pending: budgets do not apply
        with pytest.raises(KubeError) as err:
            await port.get(PODS, "db-pending", "default")
        assert err.value.code == 404
        await port.evict("default", "web-0")  # no budget selects it, no grace: gone at once
        with pytest.raises(KubeError) as err:
            await port.get(PODS, "web-0", "default")
        assert err.value.code == 404

        await port.patch(PDBS, "db", {"status": {"disruptionsAllowed": 1, "currentHealthy": 3}}, "default", "status")
        await port.evict("default", "db-0", grace_seconds=5)
        marked = await port.get(PODS, "db-0", "default")  # graceful: marked, still there
        assert marked["metadata"]["deletionGracePeriodSeconds"] == 5 and marked["metadata"]["deletionTimestamp"]
        used = (await port.get(PDBS, "db", "default"))["status"]
        assert used["disruptionsAllowed"] == 0 and set(used["disruptedPods"]) == {"db-0"}
        await port.evict("default", "db-0", grace_seconds=5)  # terminating: no budget needed, nothing changes
        assert (await port.get(PODS, "db-0", "default"))["metadata"]["resourceVersion"] == marked["metadata"][
            "resourceVersion"
        ]
        with pytest.raises(KubeError) as err:  # the budget is used up for the others
            await port.evict("default", "db-1")
        assert err.value.code == 429
        req = urllib.request.Request(
            f"{fake_api.url}/api/v1/namespaces/default/pods/db-0?gracePeriodSeconds=0", method="DELETE"
        )
        await asyncio.to_thread(lambda: urllib.request.urlopen(req, timeout=5).close())  # the kubelet finishes
        with pytest.raises(KubeError) as err:
            await port.get(PODS, "db-0", "default")
        assert err.value.code == 404

        other = {"metadata": {"name": "all-db"}, "spec": {"maxUnavailable": 1, "selector": spec["selector"]}}
        await port.create(PDBS, other, "default")
        with pytest.raises(KubeError) as err:
            await port.evict("default", "db-1")
        assert err.value.code == 500 and "more than one PodDisruptionBudget" in err.value.message
        code, status, _ = await asyncio.to_thread(
            raw_evict, "db-1", {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "db-2"}}
        )
        assert code == 400
        with pytest.raises(KubeError) as err:
            await port.evict("default", "ghost")
        assert err.value.code == 404
        assert [(e["name"], e["code"]) for e in fake_api.control("state")["evictions"]][-3:] == [
            ("db-1", 500),
            ("db-1", 400),
            ("ghost", 404),
        ]
        await port.close()

    run(go())


def test_patch_types(fake_api, tmp_path):
    async def go():
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(PODS, pod("v1"), "default")
        # merge patch: null deletes a key; pod spec is immutable (nodeName only through binding)
        await port.patch(PODS, "v1", {"metadata": {"annotations": {"k": "v", "j": "w"}}}, "default")
        got = await port.patch(PODS, "v1", {"metadata": {"annotations": {"k": None}}}, "default")
        assert got["metadata"]["annotations"] == {"j": "w"}
        with pytest.raises(KubeError) as err:
            await port.patch(PODS, "v1", {"spec": {"nodeName": "n1"}}, "default")
        assert err.value.code == 422
        await port.close()

    run(go())
    req = urllib.request.Request(
        f"{fake_api.url}/api/v1/namespaces/default/pods/v1",
        data=b"{}",
        method="PATCH",
        headers={"Content-Type": "application/apply-patch+yaml"},
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 415 and err.value.headers["Content-Type"] == "application/json"
    with pytest.raises(urllib.error.HTTPError) as err:  # bad Go bool
        urllib.request.urlopen(f"{fake_api.url}/api/v1/pods?watch=yes", timeout=5)
    assert err.value.code == 400
    with pytest.raises(urllib.error.HTTPError) as err:  # controls need the header
        urllib.request.urlopen(urllib.request.Request(f"{fake_api.url}/_fake/compact", method="POST"), timeout=5)
    assert err.value.code == 404


def test_informer_relists_after_410_and_reports_deletions_missed(fake_api, tmp_path):
    async def go():
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        seen: list[tuple[str, str]] = []
        inf = Informer(port, NODES, lambda t, o: seen.append((t, o["metadata"]["name"])))
        await port.create(NODES, {"metadata": {"name": "n1"}})
        await port.create(NODES, {"metadata": {"name": "n2"}})
        task = asyncio.create_task(inf.run())
        await inf.synced.wait()
        async with asyncio.timeout(10):  # synced comes after the list: wait for the watch itself, to freeze it
            while not fake_api.api.store.watchers:
                await asyncio.sleep(0.02)
        # while nobody watches, n1 goes and history is compacted: the informer must relist and see it
        fake_api.control("freeze-watches")  # the stream stays open but delivers nothing
        await port.delete(NODES, "n1")
        await port.create(NODES, {"metadata": {"name": "n3"}})
        fake_api.control("compact")
        fake_api.control("expire-watches")
        async with asyncio.timeout(10):
            while "/n3" not in inf.cache or "/n1" in inf.cache:
                await asyncio.sleep(0.02)
        assert ("DELETED", "n1") in seen and ("ADDED", "n3") in seen and inf.relists >= 2
        task.cancel()
        await port.close()

    run(go())


# -- kubectl (client-go) ----------------------------------------------------------------------------------
KUBECTL = shutil.which("kubectl")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not on PATH")
def test_kubectl_round_trip(fake_api, tmp_path):
    kc = fake_api.kubeconfig(str(tmp_path / "kc"))

    def k(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [KUBECTL, "--kubeconfig", kc, *args], input=stdin, capture_output=True, text=True, timeout=30
        )

    assert k("create", "-f", "-", stdin=json.dumps(pod("k1", labels={"app": "x"}))).returncode == 0
    dup = k("create", "-f", "-", stdin=json.dumps(pod("k1")))
    assert dup.returncode != 0 and "AlreadyExists" in dup.stderr
    assert k("get", "pods", "-l", "app in (x,y)", "-o", "name").stdout.split() == ["pod/k1"]
    assert k("get", "pods", "-l", "app notin (x)", "-o", "name").stdout.split() == []
    for kind, patch in (
        ("merge", '{"metadata":{"annotations":{"m":"1"}}}'),
        ("json", '[{"op":"add","path":"/metadata/annotations/j","value":"2"}]'),
        ("strategic", '{"metadata":{"annotations":{"s":"3"}}}'),
    ):
        assert k("patch", "pod", "k1", f"--type={kind}", "-p", patch).returncode == 0, kind
    got = json.loads(k("get", "--raw", "/api/v1/namespaces/default/pods/k1").stdout)
    assert got["metadata"]["annotations"] == {"m": "1", "j": "2", "s": "3"}
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "b1", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "x"}}},
    }
    assert k("create", "-f", "-", stdin=json.dumps(budget)).returncode == 0  # via discovery
    assert k("get", "pdb", "-o", "name").stdout.split() == ["poddisruptionbudget.policy/b1"]
    # kubectl get -w: list then watch from the list's RV; it must print the change made meanwhile
    watcher = subprocess.Popen(
        [KUBECTL, "--kubeconfig", kc, "get", "pods", "-w", "-o", "json", "--output-watch-events"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        first = _read_event(watcher)
        assert first["type"] == "ADDED" and first["object"]["metadata"]["name"] == "k1"
        assert k("delete", "pod", "k1").returncode == 0
        second = _read_event(watcher)
        assert second["type"] == "DELETED" and second["object"]["metadata"]["name"] == "k1"
    finally:
        watcher.kill()
        watcher.wait(5)
    assert k("get", "pod", "k1").returncode != 0


def _read_event(proc: subprocess.Popen, timeout: float = 10.0) -> dict:
    """One watch event: kubectl prints each as one line of JSON. Bounded in time, never blocks the suite."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "kubectl printed nothing in time"
    return json.loads(proc.stdout.readline())  # type: ignore[union-attr]


# -- where the real apiserver protects the cluster (design §7b), each through kubectl ----------------------
CRD = Path(__file__).resolve().parent.parent / "deploy" / "crd-queues.yaml"


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not on PATH")
def test_kubectl_sees_the_apiservers_validation(fake_api, tmp_path):
    """Names, labels, quantities, namespaces: 422/400/404 in the apiserver's words; kubectl validates
    server-side (OpenAPI v3 says the server takes fieldValidation), so an unknown field is refused too."""
    kc = fake_api.kubeconfig(str(tmp_path / "kc"))

    def create(doc: dict) -> subprocess.CompletedProcess:
        return subprocess.run(
            [KUBECTL, "--kubeconfig", kc, "create", "-f", "-"],
            input=json.dumps(doc),
            capture_output=True,
            text=True,
            timeout=30,
        )

    out = create(pod("Bad_Name"))
    assert out.returncode != 0 and 'Pod "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name"' in out.stderr
    assert "a lowercase RFC 1123 subdomain" in out.stderr
    out = create(pod("long-label", labels={"fairgpu.io/user": "x" * 64}))
    assert "metadata.labels: Invalid value" in out.stderr and "must be no more than 63 characters" in out.stderr
    out = create(pod("at-label", labels={"user": "a@b.com"}))
    assert 'metadata.labels: Invalid value: "a@b.com": a valid label must be an empty string' in out.stderr
    out = create(pod("bad-key", labels={"a/b/c": "x"}))
    assert out.returncode != 0 and "metadata.labels" in out.stderr
    bad_quantity = pod("q")
    bad_quantity["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "one"}}
    out = create(bad_quantity)
    assert out.returncode != 0 and "quantities must match the regular expression" in out.stderr
    out = create(pod("lost", ns="nowhere"))
    assert out.returncode != 0 and 'namespaces "nowhere" not found' in out.stderr
    unknown = pod("u")
    unknown["spec"]["containers"][0]["imagePolicy"] = "Always"
    out = create(unknown)
    assert out.returncode != 0 and 'unknown field "spec.containers[0].imagePolicy"' in out.stderr
    assert create(pod("fine", labels={"fairgpu.io/user": "a_b.com-1f2e3d4c5b"})).returncode == 0


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not on PATH")
def test_custom_resources_follow_their_crd(fake_api, tmp_path):
    """deploy/'s Queue CRD: types and enums give 422, unknown fields are pruned (or refused when kubectl asks
    for strict validation), strategic merge is 415 and a PUT without resourceVersion 422."""
    kc = fake_api.kubeconfig(str(tmp_path / "kc"))

    def k(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [KUBECTL, "--kubeconfig", kc, *args], input=stdin, capture_output=True, text=True, timeout=30
        )

    assert k("apply", "-f", str(CRD)).returncode == 0  # kubectl apply, validating (no --validate=false)
    queue = {"apiVersion": "fairgpu.io/v1alpha1", "kind": "Queue", "metadata": {"name": "q"}}
    out = k("create", "-f", "-", stdin=json.dumps({**queue, "spec": {"weight": "heavy"}}))
    assert 'spec.weight: Invalid value: "string": spec.weight in body must be of type number: "string"' in out.stderr
    out = k("create", "-f", "-", stdin=json.dumps({**queue, "spec": {"allocation": "greedy"}}))
    assert 'spec.allocation: Unsupported value: "greedy": supported values: "dynamic", "static"' in out.stderr
    out = k("create", "-f", "-", stdin=json.dumps({**queue, "spec": {"weight": 2, "colour": "red"}}))
    assert out.returncode != 0 and ".spec.colour: field not declared in schema" in out.stderr
    ok = {**queue, "spec": {"weight": 2, "colour": "red", "namespaces": ["a"]}}
    code, _ = _raw(fake_api, "POST", "/apis/fairgpu.io/v1alpha1/queues", ok)  # no strict validation asked
    assert code == 201
    stored = json.loads(k("get", "--raw", "/apis/fairgpu.io/v1alpha1/queues/q").stdout)
    assert stored["spec"] == {"weight": 2, "namespaces": ["a"]}  # pruned
    applied = {**queue, "metadata": {"name": "r"}, "spec": {"weight": 1}}
    assert k("apply", "-f", "-", stdin=json.dumps(applied)).returncode == 0
    assert k("apply", "-f", "-", stdin=json.dumps({**applied, "spec": {"weight": 2}})).returncode == 0
    assert json.loads(k("get", "--raw", "/apis/fairgpu.io/v1alpha1/queues/r").stdout)["spec"] == {"weight": 2}
    out = k("apply", "-f", "-", stdin=json.dumps({**applied, "spec": {"weight": 2, "colour": "red"}}))
    assert out.returncode != 0 and ".spec.colour: field not declared in schema" in out.stderr
    out = k("patch", "queue", "q", "--type=strategic", "-p", '{"spec":{"weight":3}}')
    assert (out.returncode != 0 and "UnsupportedMediaType" in out.stderr) or "unknown format" in out.stderr
    assert k("patch", "queue", "q", "--type=merge", "-p", '{"spec":{"weight":3}}').returncode == 0
    code, status = _raw(fake_api, "PUT", "/apis/fairgpu.io/v1alpha1/queues/q", {**queue, "spec": {"weight": 4}})
    assert (
        code == 422
        and "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update" in status["message"]
    )
    assert k("replace", "-f", "-", stdin=json.dumps({**stored, "spec": {"weight": 5}})).returncode != 0  # stale RV


def _raw(fake_api, method: str, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        fake_api.url + path, data=json.dumps(body).encode(), method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not on PATH")
def test_pods_of_a_deleted_node_are_collected(fake_api, tmp_path):
    kc = fake_api.kubeconfig(str(tmp_path / "kc"))

    def k(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [KUBECTL, "--kubeconfig", kc, *args], input=stdin, capture_output=True, text=True, timeout=30
        )

    assert (
        k(
            "create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
        ).returncode
        == 0
    )
    for name in ("on-n1", "elsewhere"):
        assert k("create", "-f", "-", stdin=json.dumps(pod(name))).returncode == 0
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "on-n1"}, "target": {"name": "n1"}}
    assert _raw(fake_api, "POST", "/api/v1/namespaces/default/pods/on-n1/binding", binding)[0] == 201
    assert k("delete", "node", "n1").returncode == 0
    assert k("get", "pods", "-o", "name").stdout.split() == ["pod/elsewhere"]
