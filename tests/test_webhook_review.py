"""Session 13 (safe9): the webhook answers every AdmissionReview the API server may send. Any answer but 200 with
a review is a failed call to the API server: refused for the pod webhooks (failurePolicy Fail), skipped for the
workload webhook (Ignore, so a workload's template would keep a stamp its owner rewrote)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

from fairgpu.k8s.identity import USER_LABEL
from test_webhook import gpu_pod, hook, patched, post, review, stamped, tls  # noqa: F401 (fixtures)

# The API server accepts request bodies up to 3 MiB (DefaultMaxRequestSizeBytes); an UPDATE's review carries
# the object twice. 1.5 MiB of environment is a pod or template the API server stores.
BIG = 1536 * 1024


def big(obj: dict) -> dict:
    obj["spec"]["containers"][0]["env"] = [{"name": "BLOB", "value": "x" * BIG}]
    return obj


def test_a_large_pod_is_mutated_not_refused(hook, tls):  # noqa: F811
    """Before: aiohttp's 1 MiB default body limit answered 413, and the API server refused the pod (Fail)."""
    pod = big(gpu_pod({"nvidia.com/gpu": "1"}))
    out = patched(pod, post(hook, "/mutate", review(pod), tls[0])["response"])
    assert out["spec"]["schedulerName"] == "fairgpu"
    assert out["metadata"]["labels"][USER_LABEL] == stamped("alice@example.com")[0][USER_LABEL]
    assert post(hook, "/validate", review(out), tls[0])["response"]["allowed"]


def test_a_large_workload_update_keeps_its_creators_stamp(hook, tls):  # noqa: F811
    """Before: the review of a Deployment padded past 1 MiB was refused with 413, which the API server ignores
    for this webhook: the rewritten stamp was stored, and the pods made from the template were charged to bob."""
    labels, annotations = stamped("alice@example.com")
    template = {
        "metadata": {"labels": labels, "annotations": annotations},
        "spec": gpu_pod({"nvidia.com/gpu": "1"})["spec"],
    }
    old = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": template}}
    forged_labels, forged_annotations = stamped("bob@example.com")
    new = json.loads(json.dumps(old))
    new["spec"]["template"]["metadata"] = {"labels": forged_labels, "annotations": forged_annotations}
    big(new["spec"]["template"])
    big(old["spec"]["template"])
    body = review(new, user="alice@example.com", operation="UPDATE", old=old, kind=("apps", "v1", "Deployment"))
    out = patched(new, post(hook, "/mutate", body, tls[0])["response"])
    assert out["spec"]["template"]["metadata"]["labels"] == labels
    assert out["spec"]["template"]["metadata"]["annotations"] == annotations


def test_a_body_beyond_any_the_api_server_sends_is_refused_without_reading_it(hook, tls):  # noqa: F811
    """The limit stays finite: a body larger than any review (the API server's 3 MiB request limit, twice) is
    answered 413 at once."""
    data = b"{" + b" " * (16 * 1024 * 1024) + b"}"
    req = urllib.request.Request(
        f"https://127.0.0.1:{hook.port}/validate",
        data=data,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        urllib.request.urlopen(req, timeout=5, context=ssl.create_default_context(cafile=tls[0]))
    except urllib.error.HTTPError as err:
        assert err.code == 413
    else:
        raise AssertionError("a 16 MiB body was read")
