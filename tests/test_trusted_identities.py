"""Issue 11: the identities trusted with fairgpu's scheduling keys are listed once, in the ConfigMap
deploy/trusted-identities.yaml: the API server's policy reads it as params, fairgpu's webhook reads it
mounted (`fairgpu run --trusted-identities`). Editing it changes both; they cannot drift."""

from __future__ import annotations

import json
import os

import pytest

from fairgpu.errors import InputError
from fairgpu.k8s.identity import DEFAULT_CONTROLLERS, read_trusted
from test_perimeter import cluster, gpu_pod, pytestmark, rendered, request  # noqa: F401 (fixtures and the kubectl skip)

PATH = "/api/v1/namespaces/fairgpu-system/configmaps/fairgpu-trusted-identities"


def mounted(tmp_path, data: dict[str, str]):
    """A ConfigMap volume as the kubelet lays it out: ..data → a timestamped directory, a symlink per key."""
    real = tmp_path / "..2026_12_01_08_00_00.1"
    real.mkdir()
    for k, v in data.items():
        (real / k).write_text(v)
    os.symlink(real.name, tmp_path / "..data")
    for k in data:
        os.symlink(f"..data/{k}", tmp_path / k)
    return str(tmp_path)


def test_the_webhook_reads_the_list_the_policy_reads(rendered, tmp_path):  # noqa: F811
    cm = next(d for d in rendered if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "fairgpu-trusted-identities")
    trusted, controllers = read_trusted(mounted(tmp_path, cm["data"]))
    assert trusted == [cm["data"]["hami-device-plugin"]]
    assert sorted(controllers) == sorted(DEFAULT_CONTROLLERS)  # what `fairgpu run` uses without the ConfigMap
    with pytest.raises(InputError, match=r"--trusted-identities: .* is not a directory"):
        read_trusted(str(tmp_path / "missing"))
    two = tmp_path / "two"
    two.mkdir()
    (two / "ops").write_text("ops\nmallory\n")  # the policy would trust neither: the whole value is one name
    with pytest.raises(InputError, match=r"two/ops: one identity per file, found 2 lines"):
        read_trusted(str(two))


def test_editing_the_configmap_changes_whom_the_api_server_trusts(cluster):  # noqa: F811
    """ops (an operator's break-glass identity) may re-attribute a pod once listed, not before and not after."""
    fake = cluster.fake
    fake.token("ops-token", username="ops", groups=["system:masters"])
    assert request(fake.url + "/api/v1/namespaces/a/pods", "POST", gpu_pod("p"))[0] == 201
    relabel = ["annotate", "pod", "p", "-n", "a", "--overwrite", "fairgpu.io/user-name=carol"]
    out = cluster.kubectl(*relabel, token="ops-token")
    assert out.returncode != 0 and "only fairgpu changes" in out.stderr
    cm = cluster.get(PATH)
    cm["data"]["ops"] = "ops"
    assert request(fake.url + PATH, "PUT", cm)[0] == 200
    out = cluster.kubectl(*relabel, token="ops-token")
    assert out.returncode == 0, out.stderr
    del cm["data"]["ops"]
    cm["metadata"].pop("resourceVersion")
    assert request(fake.url + PATH, "PUT", cm)[0] == 200
    out = cluster.kubectl(*relabel[:-1], "fairgpu.io/user-name=dave", token="ops-token")
    assert out.returncode != 0 and "only fairgpu changes" in out.stderr
    assert (
        json.loads(cluster.kubectl("get", "pod", "p", "-n", "a", "-o", "json").stdout)["metadata"]["annotations"][
            "fairgpu.io/user-name"
        ]
        == "carol"
    )
