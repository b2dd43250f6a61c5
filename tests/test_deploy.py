"""deploy/ renders with kustomize and every object validates against the Kubernetes schemas."""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from fairgpu.cli import app
from fairgpu.k8s.elector_process import ElectorProcess
from fairgpu.k8s.heartbeat import STALE_AFTER
from fairgpu.k8s.leader import LeaderElector

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
KUBECTL = shutil.which("kubectl")
CERT_MANAGER = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}
PROMETHEUS_OPERATOR = {("monitoring.coreos.com/v1", "ServiceMonitor")}


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    if KUBECTL is None:
        pytest.skip("kubectl not on PATH")
    out = subprocess.run([KUBECTL, "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_every_object_validates(rendered):
    kinds = {(d["apiVersion"], d["kind"]) for d in rendered}
    assert {"Namespace", "ServiceAccount", "ClusterRole", "Role", "Deployment", "Service"} <= {k for _, k in kinds}
    assert {"CustomResourceDefinition", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} <= {
        k for _, k in kinds
    }
    assert {"ValidatingAdmissionPolicy", "NetworkPolicy", "PodDisruptionBudget", "PriorityClass"} <= {
        k for _, k in kinds
    }
    for doc in rendered:
        if (doc["apiVersion"], doc["kind"]) in CERT_MANAGER | PROMETHEUS_OPERATOR:
            continue  # cert-manager's and the Prometheus Operator's kinds: no schema ships with kubernetes-validate
        kubernetes_validate.validate(doc, "1.32", strict=True)


def test_wiring_is_consistent(rendered):
    by_kind = {d["kind"]: d for d in rendered}
    deploy = by_kind["Deployment"]
    assert deploy["spec"]["replicas"] == 2 and deploy["metadata"]["namespace"] == "fairgpu-system"
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    cert = by_kind["Certificate"]
    secret = next(v["secret"]["secretName"] for v in deploy["spec"]["template"]["spec"]["volumes"])
    assert secret == cert["spec"]["secretName"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        hook = by_kind[kind]
        assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "fairgpu-system/fairgpu-webhook"
        assert hook["webhooks"][0]["clientConfig"]["service"]["name"] == by_kind["Service"]["metadata"]["name"]
    # every flag the Deployment passes is one `fairgpu run` accepts
    help_text = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    for arg in container["args"][1:]:
        flag = re.match(r"(--[a-z-]+)", arg).group(1)
        assert flag in help_text, flag


def test_the_liveness_probe_fits_the_heartbeat_and_the_lease(rendered):
    """docs/deploy.md#probes. /healthz is answered by the scheduling loop itself, 503 once its heartbeat is
    stale: a probe gives a healthy loop as long as the heartbeat does (a stretch the heartbeat tolerates is no
    failure), one failed probe restarts nothing, the hung leader's elector has handed the lease over (within
    a retry period of the heartbeat going stale) before the earliest restart, and a hung pod is restarted
    within a lease duration of it (before: 10 s × 3 with a 1 s timeout, about 30 s)."""
    container = next(d for d in rendered if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    probe = container["livenessProbe"]
    period = probe.get("periodSeconds", 10)  # Kubernetes' defaults where the manifest says nothing
    timeout, failures = probe.get("timeoutSeconds", 1), probe.get("failureThreshold", 3)
    flags = dict(a.split("=", 1) for a in container["args"][1:])
    stale = float(flags.get("--heartbeat-timeout", STALE_AFTER))
    # `fairgpu run` elects with the defaults, the same whichever --elector (docs/deploy.md: 15 s, 2 s)
    defaults = {
        (p["lease_duration"].default, p["retry_period"].default)
        for p in (inspect.signature(e).parameters for e in (LeaderElector, ElectorProcess))
    }
    assert defaults == {(15.0, 2.0)}
    ((duration, retry),) = defaults
    assert timeout >= stale
    assert failures >= 2
    assert (failures - 1) * period >= retry
    assert failures * period + timeout <= duration


def test_rbac_is_least_privilege(rendered):
    """Finding 8 (read): the grants are exactly what src/fairgpu/k8s calls; test_rbac_live runs the scheduler
    under them in the fake, which enforces them. Patches are narrowed to hami.io/ and fairgpu.io/ keys by a
    ValidatingAdmissionPolicy, since RBAC cannot."""
    role = next(d for d in rendered if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "fairgpu")
    verbs = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert verbs == {
        ("", "pods"): {"get", "list", "watch", "patch"},
        ("", "pods/binding"): {"create"},
        ("", "pods/eviction"): {"create"},
        ("", "pods/status"): {"patch"},
        ("", "nodes"): {"get", "list", "watch", "patch"},
        ("", "events"): {"create"},
        ("fairgpu.io", "queues"): {"list", "watch"},
        ("fairgpu.io", "queues/status"): {"patch"},
        ("authentication.k8s.io", "tokenreviews"): {"create"},
        ("authorization.k8s.io", "subjectaccessreviews"): {"create"},
    }
    leases = next(d for d in rendered if d["kind"] == "Role")
    assert leases["metadata"]["namespace"] == "fairgpu-system"
    assert [r.get("resourceNames") for r in leases["rules"]] == [None, ["fairgpu"]]
    # One list of trusted identities: the ConfigMap the policy reads as params is the one mounted where the
    # Deployment's --trusted-identities points; neither names anyone else (fairgpu's own account aside).
    pod = next(d for d in rendered if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--trusted-identity=")]
    where = next(a.split("=", 1)[1] for a in args if a.startswith("--trusted-identities="))
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == where)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    keys = next(d for d in rendered if d["metadata"]["name"] == "fairgpu-scheduling-keys")
    binding = next(
        d
        for d in rendered
        if d["kind"] == "ValidatingAdmissionPolicyBinding"
        and d is not keys
        and d["spec"]["policyName"] == "fairgpu-scheduling-keys"
    )
    ref = binding["spec"]["paramRef"]
    assert keys["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    assert volume["configMap"]["name"] == ref["name"] and ref["namespace"] == "fairgpu-system"
    cm = next(d for d in rendered if d["kind"] == "ConfigMap" and d["metadata"]["name"] == ref["name"])
    assert cm["metadata"]["namespace"] == ref["namespace"]
    trusted = [v for k, v in cm["data"].items() if not k.startswith("controller.")]
    assert trusted == ["system:serviceaccount:kube-system:hami-device-plugin"]
    text = yaml.safe_dump(keys)
    assert set(re.findall(r"'(system:[^']+)'", text)) == {"system:serviceaccount:fairgpu-system:fairgpu"}
    policy = next(d for d in rendered if d["metadata"]["name"] == "fairgpu-least-privilege")
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["pods", "nodes"]
    bindings = {d["spec"]["policyName"] for d in rendered if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert bindings == {d["metadata"]["name"] for d in rendered if d["kind"] == "ValidatingAdmissionPolicy"}


def test_webhooks_never_block_the_cluster(rendered):
    """Finding 4 (read): every webhook sees only tenant namespaces (never kube-system, fairgpu-system or
    cert-manager), GPU pods only where it fails closed, answers within 5 s; the Deployment survives drains
    (PodDisruptionBudget), spreads its replicas and is not preempted by the work it schedules."""
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in next(d for d in rendered if d["kind"] == kind)["webhooks"]:
            assert hook["timeoutSeconds"] <= 5
            excluded = next(
                e["values"]
                for e in hook["namespaceSelector"]["matchExpressions"]
                if e["key"] == "kubernetes.io/metadata.name"
            )
            assert {"kube-system", "fairgpu-system", "cert-manager"} <= set(excluded)
            if hook["failurePolicy"] == "Fail":
                assert hook["matchConditions"] and all(r["operations"] == ["CREATE"] for r in hook["rules"])
                assert all(r["resources"] == ["pods"] for r in hook["rules"])
    deploy = next(d for d in rendered if d["kind"] == "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    budget = next(d for d in rendered if d["kind"] == "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    assert budget["spec"]["minAvailable"] == 1 < deploy["spec"]["replicas"]
    assert pod["affinity"]["podAntiAffinity"]
    assert pod["priorityClassName"] == next(d for d in rendered if d["kind"] == "PriorityClass")["metadata"]["name"]


def test_network_policy_and_ports(rendered):
    """Finding 9 (read): metrics have their own port, reachable from the monitoring namespace only; the
    dashboard is not a container port at all (127.0.0.1, reached by port-forward)."""
    deploy = next(d for d in rendered if d["kind"] == "Deployment")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert {p["name"] for p in container["ports"]} == {"health", "metrics", "webhook"}
    assert not any(a.startswith("--dashboard-host") for a in container["args"])
    policy = next(d for d in rendered if d["kind"] == "NetworkPolicy")
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    metrics = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "metrics")
    assert metrics["from"]


def test_service_monitor_scrapes_the_metrics_port(rendered):
    monitor = next(d for d in rendered if d["kind"] == "ServiceMonitor")
    service = next(d for d in rendered if d["kind"] == "Service" and d["metadata"]["name"] == "fairgpu-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0] == {"port": "metrics", "path": "/metrics", "interval": "30s"}
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"  # the port that serves /metrics alone
