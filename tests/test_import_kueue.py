"""`fairgpu import kueue`: Kueue queues become Queue resources the controller accepts, with a line for
every field that has no fairgpu meaning."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from fairgpu.cli import app
from fairgpu.spec import QueueDoc

KUEUE = """\
apiVersion: kueue.x-k8s.io/v1beta1
kind: Cohort
metadata: {name: research}
spec:
  fairSharing: {weight: "2"}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {name: vision}
spec:
  cohort: research
  namespaceSelector: {}
  queueingStrategy: BestEffortFIFO
  fairSharing: {weight: "3"}
  preemption:
    reclaimWithinCohort: Any
    withinClusterQueue: LowerOrNewerEqualPriority
    borrowWithinCohort: {policy: LowerPriority, maxPriorityThreshold: 100}
  resourceGroups:
    - coveredResources: [cpu, memory, nvidia.com/gpu, pods]
      flavors:
        - name: a100
          resources:
            - {name: cpu, nominalQuota: 64}
            - {name: memory, nominalQuota: 512Gi}
            - {name: nvidia.com/gpu, nominalQuota: 8, borrowingLimit: 4, lendingLimit: 2}
            - {name: pods, nominalQuota: 100}
        - name: l40s
          resources:
            - {name: cpu, nominalQuota: 32}
            - {name: memory, nominalQuota: 256Gi}
            - {name: nvidia.com/gpu, nominalQuota: 4, borrowingLimit: 2, lendingLimit: 1}
            - {name: pods, nominalQuota: 50}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {name: nlp}
spec:
  cohort: research
  resourceGroups:
    - coveredResources: [nvidia.com/gpu]
      flavors:
        - name: a100
          resources:
            - {name: nvidia.com/gpu, nominalQuota: 4}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata: {name: vision, namespace: team-vision}
spec: {clusterQueue: vision}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata: {name: default, namespace: team-nlp}
spec: {clusterQueue: nlp}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata: {name: a100}
"""


def run(tmp_path: Path, text: str):
    path = tmp_path / "kueue.yaml"
    path.write_text(text)
    return CliRunner().invoke(app, ["import", "kueue", str(path)])


def test_cluster_queues_become_queues_under_their_cohort(tmp_path: Path) -> None:
    result = run(tmp_path, KUEUE)
    assert result.exit_code == 0, result.output
    queues = {q["metadata"]["name"]: q for q in yaml.safe_load_all(result.stdout)}
    assert list(queues) == ["research", "nlp", "vision"]  # the parent first, so kubectl apply is in order
    assert queues["research"]["spec"] == {"weight": 2.0}
    vision = queues["vision"]["spec"]
    assert vision["parent"] == "research" and vision["weight"] == 3.0
    # memory keeps a unit: a Queue refuses a bare byte count
    assert vision["guaranteed"] == {"cpu": "96", "memory": "768Gi", "nvidia.com/gpu": "12"}
    assert vision["limit"] == {"nvidia.com/gpu": "18"}  # nominal 12 + borrowing 6
    assert vision["lendable"] == {"nvidia.com/gpu": "3"}
    assert vision["preemption"] == {"reclaim": True, "within_queue": "LowerPriority"}
    assert vision["namespaces"] == ["team-vision"]
    nlp = queues["nlp"]["spec"]
    assert nlp["guaranteed"] == {"nvidia.com/gpu": "4"} and "limit" not in nlp  # no borrowingLimit: unbounded
    assert nlp["preemption"] == {"reclaim": False, "within_queue": "Never"} and nlp["namespaces"] == ["team-nlp"]
    for q in queues.values():  # what the controller validates the Queue spec with
        QueueDoc.model_validate({"name": q["metadata"]["name"], **{k: v for k, v in q["spec"].items()
                                                                    if k != "namespaces"}})  # fmt: skip


def test_every_unmapped_field_is_one_line(tmp_path: Path) -> None:
    result = run(tmp_path, KUEUE)
    notes = [x for x in result.stderr.splitlines() if x.startswith("note: ")]
    assert len(notes) == len(result.stderr.splitlines())
    text = "\n".join(notes)
    for needle in (
        "ClusterQueue/vision.spec.queueingStrategy: not mapped",
        "resources[3]: resource 'pods' has no fairgpu quota",
        "flavors a100, l40s are summed",
        "withinClusterQueue: LowerOrNewerEqualPriority taken as LowerPriority",
        "borrowWithinCohort: not mapped",
        "ClusterQueue/vision.spec.namespaceSelector: not mapped",
        "LocalQueue team-nlp/default: pods of team-nlp go to queue nlp",
        "ResourceFlavor/a100: no fairgpu counterpart",
    ):
        assert needle in text, needle
    assert sum("'pods'" in x for x in notes) == 2  # one per flavor that lists it


def test_bad_kueue_input_is_one_line(tmp_path: Path) -> None:
    bad = KUEUE.replace("nominalQuota: 4}\n---", "nominalQuota: lots}\n---", 1)
    result = run(tmp_path, bad)
    assert result.exit_code == 2 and "nominalQuota" not in result.stdout
    assert "ClusterQueue/nlp.spec.resourceGroups[0].flavors[0].resources[0]: 'lots'" in result.stderr
    cycle = "\n---\n".join(
        f"apiVersion: kueue.x-k8s.io/v1beta1\nkind: Cohort\nmetadata: {{name: {a}}}\nspec: {{parent: {b}}}"
        for a, b in (("x", "y"), ("y", "x"))
    )
    result = run(tmp_path, cycle)
    assert result.exit_code == 2 and "cohorts form a cycle" in result.stderr


def test_memory_quota_keeps_its_size_in_a_unit(tmp_path: Path) -> None:
    # 512Gi + 256Gi across two flavors is 768Gi; a decimal 1G is not a whole number of KiB: kilobytes
    decimal = KUEUE.replace("{name: memory, nominalQuota: 256Gi}", "{name: memory, nominalQuota: 1G}")
    queues = {q["metadata"]["name"]: q for q in yaml.safe_load_all(run(tmp_path, decimal).stdout)}
    memory = queues["vision"]["spec"]["guaranteed"]["memory"]
    assert memory == "550755813.888k"  # 512 × 2^30 + 10^9 bytes, exactly
    QueueDoc.model_validate({"name": "v", "guaranteed": {"memory": memory}})
