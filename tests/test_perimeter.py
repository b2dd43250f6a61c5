"""deploy/ as a real API server would enforce it, in the fake (tests/fakeapi): its RBAC, its admission
webhooks served by fairgpu's webhook over HTTPS, its ValidatingAdmissionPolicies (CEL), driven by kubectl
(client-go) as tenants, as fairgpu's service account and as the administrator."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from fairgpu.catalog import load_profile
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.identity import Trust, read_trusted, user_label
from fairgpu.k8s.leader import LeaderElector
from fairgpu.k8s.port import NODES, PODS, QUEUES
from fairgpu.k8s.webhook import webhook_app
from fairgpu.k8s.webhook_server import WebhookServer
from fakeapi.server import FakeApiServer
from test_live_scheduling import node, pod, until
from test_webhook import make_cert

KUBECTL = shutil.which("kubectl")
DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
SERVED = {
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "CustomResourceDefinition",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ConfigMap",
}
FAIRGPU = "system:serviceaccount:fairgpu-system:fairgpu"
pytestmark = pytest.mark.skipif(KUBECTL is None or shutil.which("openssl") is None, reason="needs kubectl, openssl")


def plural(kind: str) -> str:
    return {"ValidatingAdmissionPolicy": "validatingadmissionpolicies"}.get(kind, kind.lower() + "s")


def path_of(doc: dict) -> str:
    group_version = doc["apiVersion"]
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    ns = doc["metadata"].get("namespace")
    if ns and doc["kind"] in ("ServiceAccount", "Role", "RoleBinding", "ConfigMap"):
        base += f"/namespaces/{ns}"
    return f"{base}/{plural(doc['kind'])}"


CA: list[str] = []  # the fake's CA file, once the fixture made it


def request(url: str, method: str = "GET", body: object = None, token: str | None = None):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    ctx = ssl.create_default_context(cafile=CA[-1]) if url.startswith("https") else None
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    out = subprocess.run([KUBECTL, "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


class Cluster:
    def __init__(self, fake, tmp_path: Path, hook: WebhookServer, queues: dict) -> None:
        self.fake, self.tmp, self.hook, self.queues = fake, tmp_path, hook, queues

    def kubectl(self, *args: str, token: str = "admin-token", stdin: str | None = None) -> subprocess.CompletedProcess:
        kc = self.fake.kubeconfig(str(self.tmp / f"kc-{token}"), token)
        return subprocess.run(
            [KUBECTL, "--kubeconfig", kc, *args], input=stdin, capture_output=True, text=True, timeout=30
        )

    def create(self, doc: dict, token: str = "admin-token") -> subprocess.CompletedProcess:
        return self.kubectl("create", "-f", "-", token=token, stdin=json.dumps(doc))

    def get(self, path: str) -> dict:
        return request(self.fake.url + path)[1]


@pytest.fixture
def cluster(tmp_path, rendered):
    """An HTTPS fake (client-go sends tokens over HTTPS only) with deploy/ loaded as `kubectl apply -k` would
    (cert-manager's part played by hand: the CA bundle injected, the Service resolved to the webhook
    server), tenant namespace a, alice and bob its tenants."""
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    make_cert(cert, key)
    CA.append(str(cert))
    fake_api = FakeApiServer(("a", "b", "fairgpu-system"), (str(cert), str(key))).start()
    queues = {"team-a": ("a",)}
    # fairgpu's webhook trusts whom the ConfigMap lists, read as `fairgpu run --trusted-identities` reads it
    listed = next(d for d in rendered if d["kind"] == "ConfigMap" and "trusted" in d["metadata"]["name"])["data"]
    (tmp_path / "trusted").mkdir()
    for k, v in listed.items():
        (tmp_path / "trusted" / k).write_text(v)
    trusted, controllers = read_trusted(str(tmp_path / "trusted"))
    hook = WebhookServer(
        lambda: webhook_app(queues.get, "fairgpu", Trust.of(FAIRGPU, trusted, controllers)),
        "127.0.0.1",
        0,
        str(cert),
        str(key),
    ).start()
    ca = base64.b64encode(cert.read_bytes()).decode()
    for doc in rendered:
        if doc["kind"] not in SERVED:
            continue
        for hook_doc in doc.get("webhooks") or []:
            hook_doc["clientConfig"]["caBundle"] = ca
        code, body = request(fake_api.url + path_of(doc), "POST", doc)
        assert code == 201 or (code == 409 and doc["kind"] == "Namespace"), (path_of(doc), body)
    fake_api.control("service", namespace="fairgpu-system", name="fairgpu-webhook", address=f"127.0.0.1:{hook.port}")
    fake_api.token("admin-token", username="admin", groups=["system:masters"])
    fake_api.token("alice-token", username="alice@example.com")
    fake_api.token("bob-token", username="bob")
    fake_api.token("fairgpu-token", service_account="fairgpu-system/fairgpu")
    tenant = {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "patch", "update"]}
    for user, ns in (("alice@example.com", "a"), ("bob", "a")):
        name = user.split("@")[0]
        request(
            fake_api.url + f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
            "POST",
            {"metadata": {"name": name}, "rules": [tenant]},
        )
        binding = {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "User", "name": user}],
        }
        request(fake_api.url + f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", "POST", binding)
    yield Cluster(fake_api, tmp_path, hook, queues)
    hook.stop()
    fake_api.stop()


def gpu_pod(name: str, ns: str = "a", **spec) -> dict:
    limits = {"nvidia.com/gpu": "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}], **spec},
    }


def test_a_tenant_cannot_bypass_fairgpu(cluster):
    """Finding 2 over the wire: kubectl as alice. A GPU pod is stamped and handed to fairgpu; naming a node,
    writing HAMi's allocation or the gang mark is refused with the webhook's reason."""
    out = cluster.create(gpu_pod("ok"), "alice-token")
    assert out.returncode == 0, out.stderr
    made = cluster.get("/api/v1/namespaces/a/pods/ok")
    assert made["spec"]["schedulerName"] == "fairgpu"
    assert made["metadata"]["labels"]["fairgpu.io/user"] == user_label("alice@example.com")
    assert made["metadata"]["annotations"]["fairgpu.io/user-name"] == "alice@example.com"

    out = cluster.create(gpu_pod("pinned", nodeName="node-00"), "alice-token")
    assert out.returncode != 0
    assert 'admission webhook "pods.validate.fairgpu.io" denied the request: spec.nodeName' in out.stderr
    forged = gpu_pod("forged")
    forged["metadata"]["annotations"] = {"hami.io/vgpu-devices-allocated": "GPU-00-0,NVIDIA,81920,100:;"}
    out = cluster.create(forged, "alice-token")
    assert out.returncode != 0 and "hami.io/vgpu-devices-allocated" in out.stderr
    gang = gpu_pod("gang")
    gang["metadata"]["annotations"] = {"fairgpu.io/gang-admitted": "true"}
    assert "fairgpu.io/gang-admitted" in cluster.create(gang, "alice-token").stderr
    calls = {c["webhook"] for c in cluster.fake.api.admission.calls}
    assert calls == {"pods.mutate.fairgpu.io", "pods.validate.fairgpu.io"}


def test_identity_is_immutable_and_updates_need_no_queue(cluster):
    """Findings 5 and 6 over the wire: the API server's own policy (no call to fairgpu) refuses alice's
    and bob's changes to the user label; a change that does not touch scheduling passes though the pod's
    queue does not exist."""
    doc = gpu_pod("p")
    doc["metadata"]["labels"] = {"fairgpu.io/queue": "team-a"}
    doc["metadata"]["finalizers"] = ["example.com/keep"]
    out = cluster.create(doc, "alice-token")
    assert out.returncode == 0, out.stderr
    cluster.queues.clear()  # the queue is deleted under its pods
    patch = '{"metadata":{"labels":{"fairgpu.io/user":"bob"}}}'
    out = cluster.kubectl("patch", "pod", "p", "-n", "a", "--type=merge", "-p", patch, token="bob-token")
    assert out.returncode != 0
    assert (
        "ValidatingAdmissionPolicy 'fairgpu-scheduling-keys' with binding 'fairgpu-scheduling-keys' denied"
        in out.stderr
    )
    out = cluster.kubectl(
        "patch",
        "pod",
        "p",
        "-n",
        "a",
        "--type=json",
        "-p",
        '[{"op":"remove","path":"/metadata/finalizers"}]',
        token="alice-token",
    )
    assert out.returncode == 0, out.stderr
    assert cluster.kubectl("label", "pod", "p", "-n", "a", "app=web", token="alice-token").returncode == 0


def test_fairgpu_down_blocks_only_tenant_gpu_pods(cluster):
    """Finding 4 over the wire: with the webhook unreachable, pods that ask for no GPU, pods in kube-system
    and Jobs are created as usual; only a tenant's GPU pod is refused (it could not be scheduled anyway)."""
    cluster.hook.stop()
    plain = gpu_pod("web")
    plain["spec"]["containers"][0].pop("resources")
    assert cluster.create(plain, "alice-token").returncode == 0
    assert cluster.create(gpu_pod("system-gpu", "kube-system")).returncode == 0
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "a"},
        "spec": {"template": {"spec": {**gpu_pod("x")["spec"], "restartPolicy": "Never"}}},
    }
    assert cluster.create(job).returncode == 0  # the workload webhook is Ignore
    out = cluster.create(gpu_pod("gpu"), "alice-token")
    assert out.returncode != 0 and 'failed calling webhook "pods.mutate.fairgpu.io"' in out.stderr
    outcomes = [c["outcome"] for c in cluster.fake.api.admission.calls]
    assert len(outcomes) == 2 and all(o.startswith("error") for o in outcomes)  # the Job's, then the GPU pod's


def test_workload_templates_are_stamped_through_the_api(cluster):
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "a"},
        "spec": {"template": {"metadata": {"labels": {"fairgpu.io/user": "mallory"}}, "spec": gpu_pod("x")["spec"]}},
    }
    cluster.fake.token("admin-alice", username="alice@example.com", groups=["system:masters"])
    assert cluster.create(job, "admin-alice").returncode == 0
    template = cluster.get("/apis/batch/v1/namespaces/a/jobs/train")["spec"]["template"]["metadata"]
    assert template["labels"]["fairgpu.io/user"] == user_label("alice@example.com")


def test_a_templates_stamp_cannot_be_rewritten_while_the_workload_webhook_is_down(cluster):
    """Session 13 (safe10): the workload webhook restores a template's stamp on UPDATE, but is ignored while down;
    before, an update then wrote any user there and the pods made afterwards were charged to them. Now the API
    server's own policy refuses a changed or added stamp on the built-in kinds (a CronJob's one level deeper);
    other template changes, and removing the stamp (those pods then wait unattributed), pass."""
    cluster.fake.token("admin-alice", username="alice@example.com", groups=["system:masters"])
    cluster.fake.token("admin-bob", username="bob", groups=["system:masters"])
    spec = {"template": {"spec": {**gpu_pod("x")["spec"], "restartPolicy": "Never"}}}
    workloads = {
        "job": ("batch/v1", "Job", spec, "/spec/template"),
        "cronjob": (
            "batch/v1",
            "CronJob",
            {"schedule": "@daily", "jobTemplate": {"spec": spec}},
            "/spec/jobTemplate/spec/template",
        ),
        "deployment": ("apps/v1", "Deployment", {"selector": {}, **spec}, "/spec/template"),
    }
    for api, k, body, _ in workloads.values():
        doc = {"apiVersion": api, "kind": k, "metadata": {"name": "w", "namespace": "a"}, "spec": body}
        assert cluster.create(doc, "admin-alice").returncode == 0
    cluster.hook.stop()
    late = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "late", "namespace": "a"}, "spec": spec}
    assert cluster.create(late, "admin-alice").returncode == 0  # no stamp: its pods will wait unattributed

    def patch(kind: str, name: str, path: str, op: str, key: str, value: str = "bob") -> subprocess.CompletedProcess:
        change = {"op": op, "path": f"{path}/metadata/{key}"} | ({"value": value} if op != "remove" else {})
        return cluster.kubectl(
            "patch", kind, name, "-n", "a", "--type=json", "-p", json.dumps([change]), token="admin-bob"
        )

    denied = "ValidatingAdmissionPolicy 'fairgpu-template-stamp' with binding 'fairgpu-template-stamp' denied"
    for kind, (*_, path) in workloads.items():
        out = patch(kind, "w", path, "replace", "annotations/fairgpu.io~1user-name")
        assert out.returncode != 0 and denied in out.stderr, (kind, out.stderr)
        assert patch(kind, "w", path, "replace", "labels/fairgpu.io~1user").returncode != 0
        assert patch(kind, "w", path, "add", "annotations/example.com~1restarted-at", "now").returncode == 0
    forged = {"spec": {"template": {"metadata": {"annotations": {"fairgpu.io/user-name": "bob"}}}}}
    out = cluster.kubectl(
        "patch", "job", "late", "-n", "a", "--type=merge", "-p", json.dumps(forged), token="admin-bob"
    )
    assert out.returncode != 0 and denied in out.stderr, out.stderr
    assert patch("deployment", "w", "/spec/template", "remove", "annotations/fairgpu.io~1user-name").returncode == 0
    template = cluster.get("/apis/batch/v1/namespaces/a/jobs/w")["spec"]["template"]["metadata"]
    assert template["annotations"]["fairgpu.io/user-name"] == "alice@example.com"


def test_fairgpu_may_change_only_its_keys(cluster):
    """Finding 8: RBAC lets fairgpu patch pods and nodes; the policy narrows that to hami.io/ and fairgpu.io/
    keys. Deleting a pod is not granted at all (403 in the API server's words)."""
    request(cluster.fake.url + "/api/v1/nodes", "POST", node(0))
    request(cluster.fake.url + "/api/v1/namespaces/a/pods", "POST", gpu_pod("p"))
    t = "fairgpu-token"
    ok = '{"metadata":{"annotations":{"hami.io/vgpu-node":"node-00","fairgpu.io/gang-admitted":"true"}}}'
    assert cluster.kubectl("patch", "pod", "p", "-n", "a", "--type=merge", "-p", ok, token=t).returncode == 0
    image = '{"spec":{"containers":[{"name":"c","image":"evil"}]}}'
    out = cluster.kubectl("patch", "pod", "p", "-n", "a", "--type=strategic", "-p", image, token=t)
    assert out.returncode != 0 and "fairgpu may not change the spec" in out.stderr
    out = cluster.kubectl("label", "pod", "p", "-n", "a", "app=x", token=t)
    assert out.returncode != 0 and "fairgpu may change only hami.io/ and fairgpu.io/ labels" in out.stderr
    out = cluster.kubectl("taint", "node", "node-00", "k=v:NoSchedule", token=t)
    assert out.returncode != 0 and "fairgpu may not change the spec" in out.stderr
    out = cluster.kubectl("delete", "pod", "p", "-n", "a", token=t)
    assert out.returncode != 0
    expected = (
        'pods "p" is forbidden: User "system:serviceaccount:fairgpu-system:fairgpu" cannot delete resource '
        '"pods" in API group "" in the namespace "a"'
    )
    assert expected in out.stderr
    out = cluster.kubectl("get", "pods", "-A", token="bob-token")
    assert 'User "bob" cannot list resource "pods" in API group "" at the cluster scope' in out.stderr
    assert cluster.kubectl("get", "pods", "-n", "a", token="nope").returncode != 0  # unknown token: 401


def test_the_scheduler_runs_under_its_rbac_and_policies(cluster, tmp_path):
    """Finding 8: everything fairgpu calls is granted, nothing more is needed: a gang and a pod are bound,
    the lease taken, status written, with the service account's token and not one 403."""
    fake = cluster.fake

    fake.control("device-plugin", enabled=True)  # consumes each allocation and frees HAMi's node lock

    async def go() -> None:
        admin = await KubeClient.connect(fake.kubeconfig(str(tmp_path / "admin"), "admin-token"))
        await admin.create(NODES, node(0))
        await admin.create(QUEUES, {"metadata": {"name": "team-a"}, "spec": {"namespaces": ["a"]}})
        members = {"fairgpu.io/pod-group": "g", "fairgpu.io/min-members": "2"}
        for name, labels in (("solo", {}), ("g-0", members), ("g-1", members)):
            await admin.create(PODS, pod("a", name, {"nvidia.com/gpu": "1"}, labels), "a")
        port = await KubeClient.connect(fake.kubeconfig(str(tmp_path / "sa"), "fairgpu-token"))
        elector = LeaderElector(port, "fairgpu-system", "fairgpu", "r1")
        ctl = Controller(port, load_profile("fairgpu"), leadership=elector)
        tasks = [asyncio.create_task(ctl.run()), asyncio.create_task(elector.run())]
        try:
            bound = lambda: sum(1 for o in ctl.pods.cache.values() if o["spec"].get("nodeName"))  # noqa: E731
            await until(lambda: bound() == 3, 20, "three pods bound")
            await until(lambda: "status" in (ctl.queues.cache.get("/team-a") or {}), 10, "queue status")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await port.close()
            await admin.close()

    asyncio.run(asyncio.wait_for(go(), 60))
    assert fake.api.state.denied == []


def test_dashboard_behind_token_and_access_reviews(cluster, tmp_path):
    """Finding 9: where the dashboard is exposed, callers are authenticated with a TokenReview and authorised
    with a SubjectAccessReview made by fairgpu's service account (deploy/ grants it both): a viewer bound to
    fairgpu-dashboard-viewer reads it; bob (authenticated, and like everyone allowed the discovery paths
    /api/*) gets 403; an unknown or missing token 401. The reviews are the fake's, from its tokens and RBAC."""
    import aiohttp

    from fairgpu.k8s.app import live_apps
    from fairgpu.k8s.authn import KubeAuth
    from fairgpu.observe.server import Beside

    fake = cluster.fake
    fake.token("viewer-token", username="carol")
    binding = {
        "metadata": {"name": "carol-views"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "fairgpu-dashboard-viewer"},
        "subjects": [{"kind": "User", "name": "carol"}],
    }
    assert request(fake.url + "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", "POST", binding)[0] == 201

    async def go() -> dict[str, int]:
        port = await KubeClient.connect(fake.kubeconfig(str(tmp_path / "sa"), "fairgpu-token"))
        ctl = Controller(port, load_profile("fairgpu"))
        codes: dict[str, int] = {}
        dashboard = live_apps(ctl, "fake").dashboard
        dashboard.add_middleware(KubeAuth, port=port, resource="dashboard")  # as `fairgpu run --dashboard-auth`
        async with (
            Beside(dashboard) as dash,
            aiohttp.ClientSession() as http,
        ):
            for who, token in (("viewer", "viewer-token"), ("bob", "bob-token"), ("unknown", "nope"), ("none", None)):
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                async with http.get(f"{dash.url}/api/info", headers=headers) as resp:
                    codes[who] = resp.status
        await port.close()
        return codes

    codes = asyncio.run(asyncio.wait_for(go(), 30))
    assert codes == {"viewer": 503, "bob": 403, "unknown": 401, "none": 401}  # 503: past auth, no engine yet
    assert fake.api.state.denied == []  # fairgpu itself was allowed both reviews


def test_fake_honours_timeouts_selectors_and_failure_policy(fake_api, tmp_path):
    """The fake's admission as the apiserver's: a webhook slower than timeoutSeconds fails the request under
    Fail ("context deadline exceeded") and is skipped under Ignore; objectSelector and namespaceSelector
    keep it from being called at all; a denial comes back in ToStatusErr's words with the webhook's code."""
    from aiohttp import web

    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    make_cert(cert, key)
    calls: list[str] = []

    def app() -> web.Application:
        async def slow(request: web.Request) -> web.Response:
            review = await request.json()
            calls.append(review["request"]["name"])
            await asyncio.sleep(2)
            return web.json_response({"response": {"uid": review["request"]["uid"], "allowed": True}})

        async def deny(request: web.Request) -> web.Response:
            review = await request.json()
            status = {"code": 409, "message": "not today"}
            return web.json_response(
                {"response": {"uid": review["request"]["uid"], "allowed": False, "status": status}}
            )

        a = web.Application()
        a.router.add_post("/slow", slow)
        a.router.add_post("/deny", deny)
        return a

    hook = WebhookServer(app, "127.0.0.1", 0, str(cert), str(key)).start()
    try:
        ca = base64.b64encode(cert.read_bytes()).decode()

        def webhook(name: str, path: str, policy: str, **selectors) -> dict:
            return {
                "name": name,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": policy,
                "timeoutSeconds": 1,
                "clientConfig": {"url": f"https://127.0.0.1:{hook.port}{path}", "caBundle": ca},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
                **selectors,
            }

        config = {
            "metadata": {"name": "t"},
            "webhooks": [
                webhook("slow.ignore.test", "/slow", "Ignore", objectSelector={"matchLabels": {"slow": "ignore"}}),
                webhook("slow.fail.test", "/slow", "Fail", objectSelector={"matchLabels": {"slow": "fail"}}),
                webhook(
                    "deny.test",
                    "/deny",
                    "Fail",
                    namespaceSelector={"matchLabels": {"kubernetes.io/metadata.name": "b"}},
                ),
            ],
        }
        path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
        assert request(fake_api.url + path, "POST", config)[0] == 201
        plain = gpu_pod("plain")
        assert request(fake_api.url + "/api/v1/namespaces/a/pods", "POST", plain)[0] == 201
        assert calls == []  # no selector matched: never called
        ignored = gpu_pod("ignored")
        ignored["metadata"]["labels"] = {"slow": "ignore"}
        assert request(fake_api.url + "/api/v1/namespaces/a/pods", "POST", ignored)[0] == 201
        failed = gpu_pod("failed")
        failed["metadata"]["labels"] = {"slow": "fail"}
        code, status = request(fake_api.url + "/api/v1/namespaces/a/pods", "POST", failed)
        assert code == 500 and 'failed calling webhook "slow.fail.test"' in status["message"]
        assert "context deadline exceeded" in status["message"]
        code, status = request(fake_api.url + "/api/v1/namespaces/b/pods", "POST", gpu_pod("denied", "b"))
        assert (code, status["message"]) == (409, 'admission webhook "deny.test" denied the request: not today')
        assert calls == ["ignored", "failed"]
    finally:
        hook.stop()
