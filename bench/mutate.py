"""Mutation testing of the policy modules: a habit before a release, not a CI step.

Each mutant is one small AST change (an arithmetic, comparison, boolean or bitwise operator flipped, a
number or True/False changed, a `not` dropped) in one of the policy modules. It is written into a scratch
copy of the repository (never the working tree) and run against the tests of its module (TESTS_FOR, fastest
first; with --by-coverage, only the tests that execute its line, as a coverage run of the unmutated suite
recorded them, which costs one slow traced run of the suite first), stopping at the first failure, under a
timeout. A mutant that no test notices *survives*: either a test is missing or the change is equivalent
(docs/testing.md lists this run's survivors and which of the two each is).

    .venv/bin/python bench/mutate.py                      # every mutant (hours on 2 shared cores)
    .venv/bin/python bench/mutate.py --sample 150 --seed 1 # a uniform random sample of them
    .venv/bin/python bench/mutate.py --list               # count the mutants per module and stop

Prints one JSON line: killed, survived, timeout, total, per module, and the survivors.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGETS = (
    "src/fairgpu/fairness.py",
    "src/fairgpu/plugins/*.py",
    "src/fairgpu/framework/*.py",
    "src/fairgpu/k8s/leader.py",
    "src/fairgpu/k8s/webhook.py",
)
# Slow tests of the dashboard and packaging, which run no policy code that faster tests do not.
SKIP_TESTS = ("test_dashboard.py", "test_live_dashboard.py", "test_grafana.py", "test_deploy.py")
# The tests that exercise each module, fastest first (without --by-coverage). The engine's modules share the
# engine's tests; the slow scenario, property, live and trace tests are left out for time.
ENGINE_TESTS = (
    "tests/test_queue_policies.py",
    "tests/test_preemption_rules.py",
    "tests/test_profiles.py",
    "tests/test_scheduler.py",
    "tests/test_placement.py",
    "tests/test_explain.py",
    "tests/test_fairness.py",
)
TESTS_FOR = {
    "src/fairgpu/fairness.py": ("tests/test_fairness.py", *ENGINE_TESTS[:-1]),
    "src/fairgpu/k8s/leader.py": ("tests/test_leader_rules.py", "tests/test_leader_election.py"),
    "src/fairgpu/k8s/webhook.py": ("tests/test_webhook.py", "tests/test_live_webhook.py"),
}

FLIP: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.And: ast.Or,
    ast.Or: ast.And,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
}


@dataclass(slots=True)
class Mutant:
    file: str  # relative to the repository
    line: int
    index: int  # which mutable node of the file (walk order), to find it again in a fresh parse
    what: str


def _mutable(tree: ast.Module) -> Iterator[tuple[ast.AST, str]]:
    """(node, description) of every mutation point, in a fixed walk order. Docstrings, annotations and
    decorators (registration, dataclass options) are left alone."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.add(id(body[0].value))
            if not isinstance(node, ast.Module):
                skip.update(id(n) for d in node.decorator_list for n in ast.walk(d))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                skip.update(id(n) for a in node.args.args + node.args.kwonlyargs for n in ast.walk(a))
                if node.returns is not None:
                    skip.update(id(n) for n in ast.walk(node.returns))
        if isinstance(node, ast.AnnAssign):
            skip.update(id(n) for n in ast.walk(node.annotation))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if (isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in FLIP) or isinstance(node, ast.BoolOp):
            yield node, f"{type(node.op).__name__} -> {FLIP[type(node.op)].__name__}"
        elif isinstance(node, ast.Compare) and type(node.ops[0]) in FLIP:
            yield node, f"{type(node.ops[0]).__name__} -> {FLIP[type(node.ops[0])].__name__}"
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not | ast.Invert):
            yield node, f"drop {type(node.op).__name__}"
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
            v = node.value
            new = (not v) if isinstance(v, bool) else (v + 1 if v in (0, -1) else (0 if v == 1 else v * 2))
            yield node, f"{v!r} -> {new!r}"


def _apply(node: ast.AST) -> ast.AST:
    """The mutated node (the tree is a private copy)."""
    if isinstance(node, ast.BinOp | ast.AugAssign | ast.BoolOp):
        node.op = FLIP[type(node.op)]()
    elif isinstance(node, ast.Compare):
        node.ops[0] = FLIP[type(node.ops[0])]()
    elif isinstance(node, ast.UnaryOp):
        return node.operand
    elif isinstance(node, ast.Constant):
        v = node.value
        node.value = (not v) if isinstance(v, bool) else (v + 1 if v in (0, -1) else (0 if v == 1 else v * 2))
    return node


class _Replace(ast.NodeTransformer):
    def __init__(self, target: ast.AST) -> None:
        self.target = target

    def visit(self, node: ast.AST) -> ast.AST:
        if node is self.target:
            return _apply(node)
        return self.generic_visit(node)


def mutants(files: list[str]) -> list[Mutant]:
    out = []
    for rel in files:
        tree = ast.parse((REPO / rel).read_text())
        for i, (node, what) in enumerate(_mutable(tree)):
            out.append(Mutant(rel, node.lineno, i, what))
    return out


def mutated_source(root: Path, m: Mutant) -> str:
    tree = ast.parse((root / m.file).read_text())
    target = next(node for i, (node, _) in enumerate(_mutable(tree)) if i == m.index)
    return ast.unparse(ast.fix_missing_locations(_Replace(target).visit(tree)))


def scratch_copy(root: Path) -> Path:
    """A copy of the repository beside it (so ../shared resolves alike), never the working tree."""
    dest = root.parent / f"{root.name}-mut"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(
        root, dest, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", ".hypothesis", "*.egg-info")
    )
    return dest


def coverage_map(scratch: Path, files: list[str]) -> tuple[dict[tuple[str, int], set[str]], dict[str, float]]:
    """(file, line) → the tests (pytest node ids, per function) that run it; and each test's seconds."""
    tests = sorted(
        str(p.relative_to(scratch)) for p in (scratch / "tests").glob("test_*.py") if p.name not in SKIP_TESTS
    )
    data, junit = scratch / ".mutate-coverage", scratch / ".mutate-junit.xml"
    rc = scratch / ".mutate-coveragerc"
    rc.write_text("[run]\ndynamic_context = test_function\nsource = src/fairgpu\n")
    cmd = [sys.executable, "-m", "coverage", "run", f"--rcfile={rc}", f"--data-file={data}", "-m", "pytest"]
    cmd += ["-q", "-p", "no:cacheprovider", "-o", "addopts=", f"--junitxml={junit}", *tests]
    subprocess.run(cmd, cwd=scratch, env=_env(scratch), stdout=subprocess.DEVNULL, check=False)
    from coverage import CoverageData

    cov = CoverageData(basename=str(data))
    cov.read()
    node_of = {}
    for path in tests:  # context "test_x.test_name" (module.function) → node id "tests/test_x.py::test_name"
        node_of[Path(path).stem] = path
    lines: dict[tuple[str, int], set[str]] = {}
    for rel in files:
        measured = str(scratch / rel)
        for line, contexts in (cov.contexts_by_lineno(measured) or {}).items():
            ids = set()
            for ctx in contexts:
                mod, _, func = ctx.partition(".")
                if mod in node_of and func:
                    ids.add(f"{node_of[mod]}::{func.split('.')[-1]}")
            if ids:
                lines[rel, line] = ids
    seconds: dict[str, float] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        file = case.get("classname", "").replace(".", "/") + ".py"
        name = case.get("name", "").split("[")[0]
        key = f"{file}::{name}"
        seconds[key] = seconds.get(key, 0.0) + float(case.get("time", 0.0))
    return lines, seconds


def _env(scratch: Path) -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(scratch / "src"), "PYTHONDONTWRITEBYTECODE": "1"}


def run_mutant(scratch: Path, m: Mutant, tests: list[str], timeout: float) -> str:
    path = scratch / m.file
    original = path.read_text()
    try:
        path.write_text(mutated_source(scratch, m))
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *tests]
        done = subprocess.run(cmd, cwd=scratch, env=_env(scratch), capture_output=True, timeout=timeout, check=False)
        return "survived" if done.returncode == 0 else "killed"
    except subprocess.TimeoutExpired:
        return "timeout"
    finally:
        path.write_text(original)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=0, help="run a uniform random sample of this many mutants")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--list", action="store_true", help="count mutants per module and stop")
    ap.add_argument("--out", type=Path, help="also write every mutant's outcome here (JSON)")
    ap.add_argument("--minutes", type=float, default=0, help="stop starting mutants after this long (0: never)")
    ap.add_argument("--cap", type=float, default=300, help="at most this many seconds per mutant")
    ap.add_argument("--by-coverage", action="store_true", help="run only the tests that execute the mutated line")
    args = ap.parse_args()
    files = sorted(
        str(p.relative_to(REPO)) for pattern in TARGETS for p in REPO.glob(pattern) if p.name != "__init__.py"
    )
    every = mutants(files)
    if args.list:
        counts: dict[str, int] = {}
        for m in every:
            counts[m.file] = counts.get(m.file, 0) + 1
        print(json.dumps({"total": len(every), "per_module": counts}))
        return
    chosen = random.Random(args.seed).sample(every, args.sample if 0 < args.sample < len(every) else len(every))
    scratch = scratch_copy(REPO)
    began = time.monotonic()
    lines, seconds = coverage_map(scratch, files) if args.by_coverage else ({}, {})
    results = []
    for m in chosen:  # in sampled order: the mutants run before --minutes is up are a uniform sample too
        if args.minutes and time.monotonic() - began > 60 * args.minutes:
            break
        if args.by_coverage:
            tests = sorted(lines.get((m.file, m.line), ()), key=lambda t: seconds.get(t, 60.0))
        else:
            tests = list(TESTS_FOR.get(m.file, ENGINE_TESTS))
        if not tests:
            outcome = "uncovered"
        else:
            # Generous: a mutant that makes a loop slower is not killed by the clock alone.
            budget = min(3 * sum(seconds.get(t, 60.0) for t in tests) + 30, args.cap)
            outcome = run_mutant(scratch, m, tests, budget)
        results.append({**asdict(m), "outcome": outcome, "tests": len(tests)})
        print(f"{outcome:9} {m.file}:{m.line} {m.what}", file=sys.stderr, flush=True)
    per: dict[str, dict[str, int]] = {}
    for r in results:
        mod = per.setdefault(r["file"], {"killed": 0, "survived": 0, "timeout": 0, "uncovered": 0, "total": 0})
        mod[r["outcome"]] += 1
        mod["total"] += 1
    summary = {
        "killed": sum(r["outcome"] == "killed" for r in results),
        "survived": sum(r["outcome"] == "survived" for r in results),
        "timeout": sum(r["outcome"] == "timeout" for r in results),
        "uncovered": sum(r["outcome"] == "uncovered" for r in results),
        "total": len(results),
        "sampled": len(chosen),
        "of_all": len(every),
        "seconds": round(time.monotonic() - began),
        "per_module": per,
        "survivors": [
            f"{r['file']}:{r['line']} {r['what']}" for r in results if r["outcome"] in ("survived", "uncovered")
        ],
    }
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps(summary))
    shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
