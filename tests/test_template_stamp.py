"""Session 14 (safe11): the user on a workload's pod templates holds while fairgpu's workload webhook is down,
for every kind and template path that webhook stamps. deploy/ as shipped, driven by kubectl against the fake.

Before, a workload *created* while the webhook was down kept whatever user its creator wrote on a template
(the pods its controller made were charged to them), and an UPDATE of a custom kind (Kubeflow, JobSet, Ray)
could write one: the policy `fairgpu-template-stamp` now refuses both, letting through the workload
controllers listed in the ConfigMap fairgpu's webhook reads too, and never a workload without a stamp."""

from __future__ import annotations

import json

import yaml

from fairgpu.k8s.identity import TEMPLATE_KINDS, TRUSTED_CONFIGMAP, Trust, at, pod_templates, user_label
from fairgpu.k8s.webhook import mutate
from fakeapi.admission import cel
from test_perimeter import cluster, gpu_pod, pytestmark, rendered, request  # noqa: F401 (fixtures, kubectl skip)

ALICE, BOB = "alice@example.com", "bob"
CM = "/api/v1/namespaces/fairgpu-system/configmaps/fairgpu-trusted-identities"
DENIED = "ValidatingAdmissionPolicy 'fairgpu-template-stamp' with binding 'fairgpu-template-stamp' denied request"
# kind → apiVersion, the JSON pointer of its last pod template (the one a forger stamps: a policy reading only
# the first misses it)
KINDS = {
    "Job": ("batch/v1", "/spec/template"),
    "CronJob": ("batch/v1", "/spec/jobTemplate/spec/template"),
    "Deployment": ("apps/v1", "/spec/template"),
    "PyTorchJob": ("kubeflow.org/v1", "/spec/pytorchReplicaSpecs/Worker/template"),
    "JobSet": ("jobset.x-k8s.io/v1alpha2", "/spec/replicatedJobs/1/template/spec/template"),
    "RayJob": ("ray.io/v1", "/spec/rayClusterSpec/workerGroupSpecs/1/template"),
    "RayCluster": ("ray.io/v1", "/spec/workerGroupSpecs/1/template"),
}


def workload(kind: str, name: str, annotations: dict[str, str] | None = None, **labels: str) -> dict:
    """A workload of `kind` in namespace a with two pod templates; the last carries the metadata given."""

    def template(meta: dict | None = None) -> dict:
        return {**({"metadata": meta} if meta else {}), "spec": {**gpu_pod("x")["spec"], "restartPolicy": "Never"}}

    meta = {k: v for k, v in (("annotations", annotations), ("labels", labels)) if v}
    first, last = template(), template(meta)
    ray = {
        "headGroupSpec": {"template": first},
        "workerGroupSpecs": [{"groupName": "g"}, {"groupName": "h", "template": last}],
    }
    spec = {
        "Job": {"template": last},
        "CronJob": {"schedule": "@daily", "jobTemplate": {"spec": {"template": last}}},
        "Deployment": {"selector": {}, "template": last},
        "PyTorchJob": {"pytorchReplicaSpecs": {"Master": {"template": first}, "Worker": {"template": last}}},
        "JobSet": {
            "replicatedJobs": [
                {"name": n, "template": {"spec": {"template": t}}} for n, t in (("driver", first), ("workers", last))
            ]
        },
        "RayJob": {"entrypoint": "python train.py", "rayClusterSpec": ray},
        "RayCluster": ray,
    }[kind]
    return {"apiVersion": KINDS[kind][0], "kind": kind, "metadata": {"name": name, "namespace": "a"}, "spec": spec}


def create_all(cluster, docs: list[dict], token: str):  # noqa: F811
    """One kubectl for many objects (it goes on past a refused one and names each on stderr)."""
    return cluster.kubectl("create", "-f", "-", token=token, stdin=yaml.safe_dump_all(docs))


def stamp_of(cluster, kind: str, name: str) -> dict:  # noqa: F811
    doc = json.loads(cluster.kubectl("get", kind.lower(), name, "-n", "a", "-o", "json").stdout)
    for part in KINDS[kind][1].strip("/").split("/"):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc.get("metadata") or {}


def tokens(cluster) -> None:  # noqa: F811
    for token, user in (("admin-alice", ALICE), ("admin-bob", BOB)):
        cluster.fake.token(token, username=user, groups=["system:masters"])


def test_a_workload_created_while_fairgpu_is_down_names_no_one_but_its_creator(cluster):  # noqa: F811
    """Gap 1 and 2 at CREATE: with the workload webhook down, alice's workloads of every kind naming bob on their
    last template are refused by the API server; naming herself, or no one, they are created."""
    tokens(cluster)
    cluster.hook.stop()
    out = create_all(cluster, [workload(k, "forged", {"fairgpu.io/user-name": BOB}) for k in KINDS], "admin-alice")
    assert out.returncode != 0 and out.stderr.count(DENIED) == len(KINDS), out.stderr
    assert "names no one but its creator" in out.stderr
    own = [workload(k, "own", {"fairgpu.io/user-name": ALICE}) for k in KINDS]
    out = create_all(cluster, own + [workload(k, "plain") for k in KINDS], "admin-alice")
    assert out.returncode == 0, out.stderr
    assert stamp_of(cluster, "RayJob", "own")["annotations"]["fairgpu.io/user-name"] == ALICE


def test_listed_workload_controllers_copy_a_templates_user_and_nothing_more(cluster):  # noqa: F811
    """A CronJob's Job made by the cronjob controller (listed as shipped) carries the CronJob's user, with fairgpu
    down too; the JobSet controller may do so only once listed in the ConfigMap, which fairgpu's webhook follows
    too. A listed controller gains no right over a pod's keys."""
    cronjob = "system:serviceaccount:kube-system:cronjob-controller"
    jobset = "system:serviceaccount:jobset-system:jobset-controller-manager"
    for token, user in (("cronjob", cronjob), ("jobset", jobset)):
        cluster.fake.token(token, username=user, groups=["system:masters"])
    assert request(cluster.fake.url + "/api/v1/namespaces/a/pods", "POST", gpu_pod("p"))[0] == 201
    cluster.hook.stop()
    alices = lambda name: workload("Job", name, {"fairgpu.io/user-name": ALICE})  # noqa: E731
    assert cluster.create(alices("from-cronjob"), "cronjob").returncode == 0
    out = cluster.create(alices("from-jobset"), "jobset")
    assert out.returncode != 0 and DENIED in out.stderr
    cm = cluster.get(CM)
    cm["data"]["controller.jobset"] = jobset
    assert request(cluster.fake.url + CM, "PUT", cm)[0] == 200
    assert cluster.create(alices("from-jobset"), "jobset").returncode == 0
    out = cluster.kubectl(
        "annotate", "pod", "p", "-n", "a", "--overwrite", f"fairgpu.io/user-name={ALICE}", token="cronjob"
    )
    assert out.returncode != 0 and "only fairgpu changes" in out.stderr


def test_with_fairgpu_up_the_webhook_rewrites_what_the_policy_would_refuse(cluster):  # noqa: F811
    """The policy and the webhook agree: with the webhook up, alice's forged stamps (every kind, every template)
    are rewritten to her name, not refused; an unlisted controller's objects are charged to it (as before)."""
    tokens(cluster)
    out = create_all(cluster, [workload(k, "w", {"fairgpu.io/user-name": BOB}) for k in KINDS], "admin-alice")
    assert out.returncode == 0, out.stderr
    for kind in KINDS:
        meta = stamp_of(cluster, kind, "w")
        assert meta["annotations"]["fairgpu.io/user-name"] == ALICE, kind
        assert meta["labels"]["fairgpu.io/user"] == user_label(ALICE), kind
    operator = "system:serviceaccount:jobset-system:jobset-controller-manager"
    cluster.fake.token("jobset", username=operator, groups=["system:masters"])
    assert cluster.create(workload("Job", "from-jobset", {"fairgpu.io/user-name": ALICE}), "jobset").returncode == 0
    assert stamp_of(cluster, "Job", "from-jobset")["annotations"]["fairgpu.io/user-name"] == operator


def test_a_custom_kinds_stamp_cannot_be_rewritten_while_the_webhook_is_down(cluster):  # noqa: F811
    """Gap 2 at UPDATE: Kubeflow, JobSet and Ray templates stamped alice's at CREATE keep her name with the
    webhook down: bob's change or addition of a stamp key is refused; other changes, and removing it, pass."""
    tokens(cluster)
    custom = ("PyTorchJob", "JobSet", "RayJob", "RayCluster")
    assert create_all(cluster, [workload(k, "w") for k in custom], "admin-alice").returncode == 0
    cluster.hook.stop()

    def patch(kind: str, op: str, key: str, value: str = BOB):
        change = {"op": op, "path": f"{KINDS[kind][1]}/metadata/{key}"} | ({"value": value} if op != "remove" else {})
        return cluster.kubectl(
            "patch", kind.lower(), "w", "-n", "a", "--type=json", "-p", json.dumps([change]), token="admin-bob"
        )

    for kind in custom:
        out = patch(kind, "replace", "annotations/fairgpu.io~1user-name")
        assert out.returncode != 0 and DENIED in out.stderr, (kind, out.stderr)
        assert patch(kind, "add", "annotations/example.com~1restarted-at", "now").returncode == 0
    for kind, op, key in (
        ("RayCluster", "replace", "labels/fairgpu.io~1user"),
        ("JobSet", "add", "annotations/fairgpu.io~1unattributed"),
    ):
        out = patch(kind, op, key)
        assert out.returncode != 0 and DENIED in out.stderr, (kind, key, out.stderr)
    assert patch("RayJob", "remove", "annotations/fairgpu.io~1user-name").returncode == 0
    assert stamp_of(cluster, "PyTorchJob", "w")["annotations"]["fairgpu.io/user-name"] == ALICE


def test_without_the_list_no_workload_is_blocked(cluster):  # noqa: F811
    """The ConfigMap deleted: the policy is skipped (its binding allows), so creating a workload never waits
    for it."""
    tokens(cluster)
    cluster.hook.stop()
    assert request(cluster.fake.url + CM, "DELETE")[0] == 200
    out = create_all(cluster, [workload(k, "plain") for k in ("Job", "JobSet")], "admin-alice")
    assert out.returncode == 0, out.stderr


def test_the_policy_covers_the_workload_webhooks_kinds_and_reads_fairgpus_list(rendered):  # noqa: F811
    """The policy guards what the workload webhook stamps (its rules, CREATE and UPDATE), and reads as params
    the ConfigMap mounted where `fairgpu run --trusted-identities` reads its controllers."""
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in rendered}
    policy = by_name["ValidatingAdmissionPolicy", "fairgpu-template-stamp"]["spec"]
    hook = next(h for h in by_name["MutatingWebhookConfiguration", "fairgpu"]["webhooks"] if "workloads" in h["name"])
    drop_scope = lambda rules: [{k: v for k, v in r.items() if k != "scope"} for r in rules]  # noqa: E731
    assert policy["matchConstraints"]["resourceRules"] == drop_scope(hook["rules"])
    assert policy["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    ref = by_name["ValidatingAdmissionPolicyBinding", "fairgpu-template-stamp"]["spec"]["paramRef"]
    assert (ref["namespace"], ref["name"]) == TRUSTED_CONFIGMAP


def test_a_forged_label_on_a_template_never_reaches_its_pods():
    """Why the policy checks the name and not the label (a hash CEL cannot compute): a pod the job controller
    makes from a template naming alice and labelled as bob's is labelled alice's by the pod webhook, which is
    never down when a GPU pod is created (failurePolicy Fail)."""
    pod = gpu_pod("p")
    pod["metadata"] |= {"annotations": {"fairgpu.io/user-name": ALICE}, "labels": {"fairgpu.io/user": user_label(BOB)}}
    ops = mutate(pod, "system:serviceaccount:kube-system:job-controller", "fairgpu", Trust())
    assert {"op": "add", "path": "/metadata/labels/fairgpu.io~1user", "value": user_label(ALICE)} in ops


def test_fairgpu_run_takes_its_workload_controllers_from_the_mounted_list(tmp_path, monkeypatch):
    """With the ConfigMap mounted its controller.* entries are fairgpu's whole list, as they are the policy's (a
    default kept beside them would keep stamps the policy refuses); without it, kube-controller-manager's. A
    mounted list naming none (one from before) is refused at start rather than charging every Job's pods to
    the job controller."""
    import inspect

    from typer.testing import CliRunner

    from fairgpu.cli import app
    from fairgpu.k8s import app as live
    from fairgpu.k8s.identity import DEFAULT_CONTROLLERS

    seen: list[Trust] = []
    signature = inspect.signature(live.run)

    async def run(*args: object) -> None:
        trust = signature.bind(*args).arguments["trust"]
        seen.append(trust if isinstance(trust, Trust) else trust())

    monkeypatch.setattr(live, "run", run)
    mounted = tmp_path / "trusted"
    mounted.mkdir()
    (mounted / "hami").write_text("hami")
    (mounted / "controller.jobset").write_text("jobset")
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text("current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\n")
    for extra in (["--trusted-identities", str(mounted)], []):
        result = CliRunner().invoke(app, ["run", "--kubeconfig", str(kubeconfig), *extra])
        assert result.exit_code == 0, result.output
    assert [(t.trusted, t.controllers) for t in seen] == [
        ({"hami"}, {"jobset"}),
        (set(), set(DEFAULT_CONTROLLERS)),
    ]
    (mounted / "controller.jobset").unlink()  # a ConfigMap from before the controllers moved into it
    result = CliRunner().invoke(app, ["run", "--kubeconfig", str(kubeconfig), "--trusted-identities", str(mounted)])
    assert result.exit_code == 2 and "lists no workload controller" in result.output, result.output
    assert len(seen) == 2


def test_the_policy_reads_the_templates_the_webhook_stamps(rendered):  # noqa: F811
    """For every kind the workload webhook stamps, the policy's `templates` (evaluated as the fake evaluates
    CEL) are exactly the templates at identity.pod_templates' paths: none missed (a forger's stamp there would
    pass), none extra."""
    policy = next(d for d in rendered if d["metadata"]["name"] == "fairgpu-template-stamp")["spec"]
    expressions = {v["name"]: v["expression"] for v in policy["variables"]}

    def template(mark: str) -> dict:
        return {"metadata": {"name": mark}, "spec": {"containers": [{"name": "c"}]}}

    def spec(group: str, kind: str) -> dict:
        ray = {"headGroupSpec": {"template": template("head")}, "workerGroupSpecs": [{"template": template("w0")}]}
        ray["workerGroupSpecs"].append({"template": template("w1")})
        if group in ("batch", "apps"):
            inner = {"template": template("only")}
            return {"jobTemplate": {"spec": inner}} if kind == "CronJob" else inner
        if group == "kubeflow.org":
            roles = {role: {"replicas": 1, "template": template(role)} for role in ("Master", "Worker")}
            return {f"{kind[:-3].lower()}ReplicaSpecs": roles, "runPolicy": {}}
        if kind == "JobSet":
            jobs = [{"name": f"j{i}", "template": {"spec": {"template": template(f"j{i}")}}} for i in range(2)]
            return {"replicatedJobs": jobs}
        return {"rayClusterSpec": ray} if kind == "RayJob" else ray

    for group, kind in sorted(TEMPLATE_KINDS):
        obj = {"metadata": {"name": "w"}, "spec": spec(group, kind)}
        request_ = {"operation": "CREATE", "kind": {"group": group, "version": "v1", "kind": kind}}
        variables: dict = {}
        for name in ("objects", "templates"):
            value = cel(expressions[name], {"object": obj, "request": request_, "variables": variables})
            variables[name] = json.loads(json.dumps(value))  # CEL's values back to JSON, as the fake does
        read = sorted(str(t["metadata"]["name"]) for group_ in variables["templates"][0] for t in group_)
        stamped = sorted(at(obj, (*path, "metadata", "name")) for path in pod_templates(group, kind, obj))
        assert read == stamped and len(read) >= 1, (kind, read, stamped)
