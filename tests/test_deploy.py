"""deploy/ renders with kustomize and every object validates against the Kubernetes schemas."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from fairgpu.cli import app

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


def test_rbac_is_least_privilege(rendered):
    role = next(d for d in rendered if d["kind"] == "ClusterRole")
    verbs = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert verbs[("", "pods/binding")] == {"create"}
    assert "delete" not in verbs[("", "pods")] and "update" not in verbs[("", "nodes")]
    assert all("*" not in v for v in verbs.values())
    leases = next(d for d in rendered if d["kind"] == "Role")
    assert leases["metadata"]["namespace"] == "fairgpu-system"


def test_service_monitor_scrapes_the_metrics_port(rendered):
    monitor = next(d for d in rendered if d["kind"] == "ServiceMonitor")
    service = next(d for d in rendered if d["kind"] == "Service" and d["metadata"]["name"] == "fairgpu-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0] == {"port": "metrics", "path": "/metrics", "interval": "30s"}
    assert service["spec"]["ports"][0]["targetPort"] == "health"  # the port that serves /healthz and /metrics
