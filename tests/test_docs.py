"""Every `fairgpu` and `kubectl fairgpu` command in README.md and docs/*.md runs as written, so the docs
cannot drift from the CLI. Stand-ins keep it quick: small CSVs for PODS.csv / NODES.csv and the openb
paths, a 6-hour horizon on trace replays; commands that need a cluster or serve forever (`run`,
`kubectl fairgpu`, `--serve`) are checked against their command's options instead."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fairgpu.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},64000,262144,8,V100M32\n" for i in range(4))
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
PODS += "".join(
    f"p{i},4000,8192,1,{500 if i % 2 else 1000},,LS,Running,{60 * i},{60 * i + 3600},{60 * i}\n" for i in range(20)
)


def commands() -> list[tuple[str, str]]:
    """(doc name, command) for every fairgpu command line in a ```sh block."""
    out = []
    for doc in DOCS:
        for block in re.findall(r"```sh\n(.*?)```", doc.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if re.match(r"(\.venv/bin/fairgpu|fairgpu|kubectl fairgpu) ", line):
                    out.append((doc.name, line))
    return out


COMMANDS = commands()


def test_the_docs_have_commands() -> None:
    assert len(COMMANDS) >= 15 and {d for d, _ in COMMANDS} >= {"README.md", "dashboard.md", "performance.md"}


@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=[f"{d}:{c[:60]}" for d, c in COMMANDS])
def test_doc_command_runs(doc: str, command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "NODES.csv").write_text(NODES)
    (tmp_path / "PODS.csv").write_text(PODS)
    (tmp_path / "kueue.yaml").write_text(
        "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ClusterQueue\nmetadata: {name: q}\nspec: {}\n"
    )
    args = shlex.split(command.replace("[--json]", "").replace("[--profile kube-default]", ""))
    args = args[2:] if args[0] == "kubectl" else args[1:]
    out_file = None
    if ">" in args:
        at = args.index(">")
        out_file, args = tmp_path / args[at + 1], args[:at]
    args = [_stand_in(a, tmp_path) for a in args]
    if args[0] in ("run", "queues", "workloads", "why", "top") or "--serve" in args:
        _check_options(args)
        return
    if "--trace" in args and "--horizon" not in args:
        args += ["--horizon", "6h"]
    elif "--trace" in args:
        args[args.index("--horizon") + 1] = "6h"
    elif args[0] == "simulate" and len(args) > 1 and "--horizon" not in args:
        # The bare `simulate` (make demo) replays the demo in full; an hour shows what another scenario or
        # an output option adds as well as six do, at a sixth of the suite's time.
        args += ["--horizon", "1h"]
    for name in ("mine.yaml", "my.yaml"):  # the file an earlier command of the same doc wrote
        if name in args and not (tmp_path / name).exists():
            (tmp_path / name).write_text((ROOT / "src/fairgpu/sim/scenarios/demo.yaml").read_text())
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, f"{doc}: {command}\n{result.output}"
    if out_file is not None:
        out_file.write_text(result.stdout)


def _stand_in(arg: str, tmp: Path) -> str:
    if "docs/examples/" in arg:  # files the docs ship, named from the repository root
        prefix, _, rel = arg.rpartition("docs/examples/")
        return f"{prefix}{ROOT / 'docs/examples' / rel}"
    if "openb_node_list" in arg:
        return str(tmp / "NODES.csv")
    if "openb_pod_list" in arg:
        return str(tmp / "PODS.csv")
    for kind in ("openb:", "philly:"):
        if arg.startswith(kind) and kind == "openb:":
            return f"openb:{tmp / 'PODS.csv'}"
    if arg.startswith("philly:../shared/"):
        real = ROOT / arg.removeprefix("philly:")
        if not real.is_file():
            pytest.skip("the Philly trace is not available (../shared/traces)")
        return f"philly:{real.resolve()}"
    return arg


def _check_options(args: list[str]) -> None:
    """A command that needs a cluster or serves forever: its subcommand exists and knows every option."""
    words = [a for a in args if not a.startswith("-")]
    sub = args[0]
    result = CliRunner().invoke(app, [sub, "--help"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    for opt in (a.split("=")[0] for a in args if a.startswith("--")):
        assert opt in text, (args, opt)
    if sub == "top":
        assert words[1] in ("gpus", "nodes")


# -- the docs describe what the code has ----------------------------------------------------------------


REPO_PATH = re.compile(r"(?<![\w/.])((?:docs|tests|bench|src|deploy|design)/[\w./-]*\w\.(?:md|py|yaml|yml|json))")


def test_every_link_and_named_file_exists() -> None:
    """Docs once pointed at design pages that are not in the repository. Links resolve beside the doc; a
    repository path named in the text (not in an example block, which may name a file to create) exists."""
    broken = []
    for doc in DOCS:
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not re.match(r"[a-z]+://", target) and not (doc.parent / target).exists():
                broken.append(f"{doc.name}: link {target}")
        for path in REPO_PATH.findall(re.sub(r"```.*?```", "", text, flags=re.S)):
            if not (ROOT / path).exists():
                broken.append(f"{doc.name}: {path}")
    assert not broken


def test_every_result_field_is_documented() -> None:
    """metrics.md defines every key of `simulate --json` (lost_gpu_hours was once missing). The keys do not
    depend on how long the replay runs, so an hour of the demo is enough."""
    result = CliRunner().invoke(
        app, ["simulate", "--scenario", "demo", "--profile", "fairgpu", "--horizon", "1h", "--json"]
    )
    doc = json.loads(result.stdout)
    queue = next(iter(doc["queues"].values()))
    metrics = (ROOT / "docs" / "metrics.md").read_text()
    missing = [k for k in [*doc, *queue, *doc["idle_gpu_hours"]] if f"`{k}`" not in metrics]
    assert not missing


def test_every_plugin_is_in_the_profile_reference_at_its_point() -> None:
    from fairgpu.plugins.registry import IN_TREE

    reference = (ROOT / "docs" / "profiles.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (\w+) \|", reference, re.M))
    assert {name: rows.get(name) for name in IN_TREE} == {
        name: entry.point.__name__[0].lower() + entry.point.__name__[1:] for name, entry in IN_TREE.items()
    }
