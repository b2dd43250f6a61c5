"""Mutation testing of the policy modules: a habit before a release, not a CI step.

Each mutant is one small AST change (an arithmetic, comparison, boolean or bitwise operator flipped, a
number or True/False changed, a `not` dropped) in one of the policy modules. It runs in a scratch copy of the
repository (never the working tree) against only the tests that execute its line, as one coverage run of the
unmutated suite recorded them (per-test contexts; cached until a source or test file changes), fastest first,
stopping at the first failure, under a timeout of ten times those tests' baseline time (+15 s); in passes by test
time (--tiers), so every mutant's fast tests run before any mutant's slow ones, which only the survivors run.
A long-lived worker (bench/mutate_worker.py) has imported everything once and forks per mutant, so a mutant
costs its tests and not an interpreter start. A mutant that no test notices *survives*: a test is missing or
the change is equivalent (docs/testing.md counts them and gives the recurring equivalence arguments);
one on a line no test runs is *uncovered*.

    .venv/bin/python bench/mutate.py                          # every mutant; resumes from --state
    .venv/bin/python bench/mutate.py --only fragmentation     # the modules whose path contains this
    .venv/bin/python bench/mutate.py --upto 0.5               # only the first pass (tests up to 0.5 s)
    .venv/bin/python bench/mutate.py --list                   # count the mutants per module and stop
    .venv/bin/python bench/mutate.py --changed-since 445efb4  # only those of code changed since (moves aside)
    .venv/bin/python bench/mutate.py --mutant FILE:INDEX --test tests/test_x.py   # one mutant, nothing recorded

Progress goes to stderr, one line per mutant; every outcome is appended to <state>/results.jsonl (a rerun
skips the mutants already there, keyed by the file's content); the summary is one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import itertools
import json
import math
import os
import queue
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

import mutate_changed

REPO = Path(__file__).resolve().parent.parent
TARGETS = (
    "src/fairgpu/fairness.py",
    "src/fairgpu/state.py",  # where a GPU booked twice would come from
    "src/fairgpu/state_kernels.py",  # state.py's fits and bookkeeping, compiled
    "src/fairgpu/changes.py",  # a stale answer leaves caches of filters and scores stale
    "src/fairgpu/plugins/*.py",
    "src/fairgpu/framework/*.py",
    "src/fairgpu/k8s/leader.py",
    "src/fairgpu/k8s/heartbeat.py",
    "src/fairgpu/k8s/replica.py",
    "src/fairgpu/k8s/elector_process.py",
    "src/fairgpu/k8s/webhook.py",
    # the live pass's accounting: a pod read wrong, a bind mistaken or a gang mis-formed books a GPU twice
    "src/fairgpu/k8s/translate.py",
    "src/fairgpu/k8s/carryout.py",
    "src/fairgpu/k8s/reconcile.py",
    "src/fairgpu/k8s/workloads.py",
    "src/fairgpu/k8s/recording.py",
    # a Binding re-sent or counted as landed wrong books a GPU twice; a write thought unanswered releases a lease
    # while it may land; the webhook's limits must fail closed; a late condition must not wipe a running pod's
    "src/fairgpu/k8s/binder.py",
    "src/fairgpu/k8s/writes.py",
    "src/fairgpu/k8s/webhook_server.py",
    "src/fairgpu/k8s/reporter.py",
    # whose requests are trusted to name a user, and which workload controllers' copies are
    "src/fairgpu/k8s/identity.py",
    "src/fairgpu/cli/run.py",
)
# Slow tests of the dashboard and packaging, which run no policy code that faster tests do not.
SKIP_TESTS = ("test_dashboard.py", "test_live_dashboard.py", "test_grafana.py", "test_deploy.py")
# each wants a test or an argument; "pending" survived its fast tests and waits for the slow pass
UNDECIDED = ("survived", "uncovered", "capped", "error", "pending")
# Left out of the coverage run, so no mutant runs them. The full fill's policy code runs in a process pool,
# whose coverage is lost, so tracing only slows it (by tens of minutes); the docs' commands replay real
# traces through the CLI, minutes each when traced, over engine code the scenario and trace tests run too.
NOT_TRACED = (
    "tests/test_fill.py::test_full_fill_reproduces_the_paper_and_fairgpu_beats_fgd",
    "tests/test_docs.py::test_doc_command_runs",
)
# A hung mutant (an endless loop) costs this many times its tests' time; 3 proved too few on two cores at a
# load of 13, where unmutated tests ran past it and would have counted as kills.
TIMEOUT_FACTOR = 10
SPAWN_START = 60.0  # seconds allowed a fresh interpreter to start, on top of its tests' timeout
OUTCOMES = ("killed", "timeout", "survived", "uncovered", "capped", "error", "pending")

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
    scope: str  # qualified name of the outermost function whose body holds it; "" at module or class level
    # "file:line" of the lines whose tests may notice it: its own and its statement's first; for one where
    # something is defined, where that is used (_definition_reach)
    lines: tuple[str, ...]
    digest: str  # of the file's source: a result is valid for this text only
    jit: bool = False  # in a function numba compiles (scope names it): the worker compiles the mutated one
    span: tuple[int, int] = (0, 0)  # first and last line of its statement (a compound statement's header)

    @property
    def key(self) -> str:
        return f"{self.file}:{self.index}:{self.digest}"


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


def _scopes(tree: ast.Module) -> dict[int, str]:
    """id(node) → qualified name of the outermost function whose body holds it. Defaults and decorators are
    evaluated where the function is defined, so they belong to the enclosing (module or class) level."""
    out: dict[int, str] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                out.update((id(n), prefix + stmt.name) for s in stmt.body for n in ast.walk(s))
            elif isinstance(stmt, ast.ClassDef):
                walk(stmt.body, f"{prefix}{stmt.name}.")

    walk(tree.body, "")
    return out


def _statement_spans(tree: ast.Module) -> dict[int, tuple[int, int]]:
    """id(expression node) → first and last line of the statement it belongs to (of a compound statement, its
    header: what is not its body)."""
    out: dict[int, tuple[int, int]] = {}
    for stmt in ast.walk(tree):
        if isinstance(stmt, ast.stmt):
            nodes = [
                n
                for field, value in ast.iter_fields(stmt)
                if field not in ("body", "orelse", "finalbody", "handlers", "cases")
                for v in (value if isinstance(value, list) else [value])
                if isinstance(v, ast.AST)
                for n in ast.walk(v)
            ]
            end = max((getattr(n, "end_lineno", None) or stmt.lineno for n in nodes), default=stmt.lineno)
            span = (stmt.lineno, end)
            out.update((id(n), span) for n in nodes)
    return out


def _uses(files: list[str], root: Path) -> dict[str, set[str]]:
    """name → "file:line" of every line of the policy modules that reads it (as a name or an attribute)."""
    out: dict[str, set[str]] = {}
    for rel in files:
        for n in ast.walk(ast.parse((root / rel).read_text())):
            if isinstance(n, ast.Name | ast.Attribute) and isinstance(n.ctx, ast.Load):
                out.setdefault(n.id if isinstance(n, ast.Name) else n.attr, set()).add(f"{rel}:{n.lineno}")
    return out


def _definition_reach(tree: ast.Module, rel: str, uses: dict[str, set[str]]) -> dict[int, tuple[str, ...]]:
    """id(node) → the lines whose tests may notice a change made where something is defined, not run: a
    default, in the function's body; a module constant or class attribute, where its name is read."""
    out: dict[int, tuple[str, ...]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = tuple(f"{rel}:{ln}" for ln in range(node.body[0].lineno, (node.end_lineno or 0) + 1))
            for d in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
                out.update((id(n), body) for n in ast.walk(d))
        if isinstance(node, ast.Module | ast.ClassDef):
            for stmt in node.body:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None and names:
                    reach = tuple(sorted(set().union(*(uses.get(name, set()) for name in names))))
                    out.update((id(n), reach) for n in ast.walk(stmt.value))
    return out


def _jitted(tree: ast.Module) -> set[str]:
    """Names of the module's functions numba compiles (a decorator naming `jit`)."""
    return {
        f.name
        for f in tree.body
        if isinstance(f, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in f.decorator_list)
    }


def mutants(files: list[str], root: Path = REPO) -> list[Mutant]:
    every_file = sorted(str(p.relative_to(root)) for pattern in TARGETS for p in root.glob(pattern))
    uses = _uses(every_file, root)
    out = []
    for rel in files:
        text = (root / rel).read_text()
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        tree = ast.parse(text)
        scopes, spans, reach = _scopes(tree), _statement_spans(tree), _definition_reach(tree, rel, uses)
        jitted = _jitted(tree)
        for i, (node, what) in enumerate(_mutable(tree)):
            scope = scopes.get(id(node), "")
            if scope in jitted:
                # numba compiles it from the source, unseen by coverage and by a code swap: the tests that
                # run the lines calling it, with the mutated function compiled anew in the worker's child
                lines = tuple(sorted(uses.get(scope, ())))
            elif scope:
                end = getattr(node, "end_lineno", None) or node.lineno
                own = {spans.get(id(node), (node.lineno,))[0], *range(node.lineno, end + 1)}
                lines = tuple(f"{rel}:{ln}" for ln in sorted(own))
            else:
                lines = reach.get(id(node), ())
            span = spans.get(id(node), (node.lineno, getattr(node, "end_lineno", None) or node.lineno))
            out.append(Mutant(rel, node.lineno, i, what, scope, lines, digest, scope in jitted, span))
    return out


def mutated_tree(root: Path, file: str, index: int) -> ast.Module:
    tree = ast.parse((root / file).read_text())
    target = next(node for i, (node, _) in enumerate(_mutable(tree)) if i == index)
    return ast.fix_missing_locations(_Replace(target).visit(tree))


def scratch_copy(root: Path, n: int | str = 0) -> Path:
    """A copy of the repository beside it (so ../shared resolves alike), never the working tree; the n-th
    for the n-th worker. A run's copies are its own: a second command on the same repository must name
    others (`--mutant` does), or it would delete them under the run."""
    dest = root.parent / f"{root.name}-mut{n or ''}"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(
        root,
        dest,
        # numba's on-disk cache (*.nbi, *.nbc in __pycache__) is kept: it is keyed by the source's content
        ignore=shutil.ignore_patterns(".venv", ".git", "*.pyc", ".hypothesis", "*.egg-info", "out"),
    )
    return dest


def env(scratch: Path) -> dict[str, str]:
    # One BLAS thread: the worker forks, and the machine's cores are shared.
    return {
        **os.environ,
        "PYTHONPATH": str(scratch / "src"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted([*(root / "src").rglob("*.py"), *(root / "tests").rglob("*.py")]):
        h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()[:16]


def _suite(scratch: Path) -> list[str]:
    """pytest's arguments for the traced runs: the suite but SKIP_TESTS and NOT_TRACED."""
    tests = sorted(
        str(p.relative_to(scratch)) for p in (scratch / "tests").glob("test_*.py") if p.name not in SKIP_TESTS
    )
    return ["-q", "-p", "no:cacheprovider", "-o", "addopts=", *tests, *(f"--deselect={t}" for t in NOT_TRACED)]


def coverage_map(scratch: Path, files: list[str], state: Path) -> tuple[dict[str, list[str]], dict[str, float]]:
    """("file:line" → node ids of the tests that run it, node id → its seconds), from one coverage run of the
    suite with per-test contexts, cached in `state` until a source or test file changes."""
    cache = state / f"coverage-{_tree_digest(scratch)}.json"
    if cache.exists():
        saved = json.loads(cache.read_text())
        return saved["lines"], saved["seconds"]
    data, junit = scratch / ".mutate-coverage", scratch / ".mutate-junit.xml"
    included = ",".join(str(scratch / f) for f in files)
    cmd = [sys.executable, str(scratch / "bench" / "mutate_coverage.py"), str(data), included]
    cmd += [f"--junitxml={junit}", *_suite(scratch)]
    with (state / "coverage.log").open("w") as log:  # pytest's progress dots, to follow the slow traced run
        done = subprocess.run(cmd, cwd=scratch, env=env(scratch), stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:  # every mutant would be measured against a suite that already fails
        sys.exit(f"the unmutated suite failed under coverage: see {state / 'coverage.log'}")
    from coverage import CoverageData

    cov = CoverageData(basename=str(data))
    cov.read()
    lines: dict[str, list[str]] = {}
    for rel in files:
        for line, contexts in (cov.contexts_by_lineno(str(scratch / rel)) or {}).items():
            ids = sorted({c.split("[")[0] for c in contexts if c})  # a test's parameters run together
            if ids:
                lines[f"{rel}:{line}"] = ids
    seconds: dict[str, float] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        key = f"tests/{case.get('classname', '').split('.')[-1]}.py::{case.get('name', '').split('[')[0]}"
        seconds[key] = round(seconds.get(key, 0.0) + float(case.get("time", 0.0)), 3)
    cache.write_text(json.dumps({"lines": lines, "seconds": seconds}))
    return lines, seconds


@dataclass(slots=True)
class Infection:
    """Which tests infect each probed mutant (bench/mutate_infect.py): those that evaluate its node to another
    value. A test that does not cannot kill it, so it is not run against it."""

    ids: dict[str, int]  # "file:index" → probe id, for the probed mutants
    infected: dict[str, set[int]]  # test node id → probe ids it infects
    failed: set[str]  # tests that failed in the infection run: their record may be cut short

    def narrow(self, m: Mutant, tests: set[str]) -> set[str]:
        pid = self.ids.get(f"{m.file}:{m.index}")
        if pid is None:
            return tests
        return {t for t in tests if t in self.failed or t not in self.infected or pid in self.infected[t]}


def infection_map(scratch: Path, files: list[str], state: Path) -> Infection:
    """From one run of the suite with every operator mutant probed, cached in `state` like the coverage."""
    cache = state / f"infection-{_tree_digest(scratch)}.json"
    if not cache.exists():
        cmd = [sys.executable, str(scratch / "bench" / "mutate_infect.py"), str(cache), ",".join(files)]
        with (state / "infection.log").open("w") as log:
            subprocess.run(cmd + _suite(scratch), cwd=scratch, env=env(scratch), stdout=log, stderr=subprocess.STDOUT)
        if not cache.exists():
            sys.exit(f"the infection run recorded nothing: see {state / 'infection.log'}")
    saved = json.loads(cache.read_text())
    unprobed = set(saved["unprobed"])  # imported around the probes: their mutants keep every covering test
    ids = {k: v for k, v in saved["ids"].items() if k.rpartition(":")[0] not in unprobed}
    infected = {t: set(v) for t, v in saved["infected"].items()}
    return Infection(ids, infected, set(saved["failed"]))


def covering(m: Mutant, lines: dict[str, list[str]]) -> set[str]:
    """The tests that may notice a mutant: those that run its lines (see Mutant.lines); when those are none
    for a mutant outside any function (run once, at import, so under no test), those that run any line of
    its module."""
    tests = {t for key in m.lines for t in lines.get(key, ())}
    if tests or (m.scope and not m.jit):
        return tests
    return {t for key, ids in lines.items() if key.rpartition(":")[0] == m.file for t in ids}


class Worker:
    """bench/mutate_worker.py in the scratch copy: one JSON request and one JSON answer per mutant."""

    def __init__(self, scratch: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-u", str(scratch / "bench" / "mutate_worker.py")],
            cwd=scratch,
            env=env(scratch),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, m: Mutant, tests: list[str], timeout: float) -> dict[str, object]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request = {"file": m.file, "index": m.index, "scope": m.scope, "jit": m.jit, "tests": tests, "timeout": timeout}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return dict(json.loads(self.proc.stdout.readline()))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def summarize(results: list[dict[str, object]], total: int) -> dict[str, object]:
    per: dict[str, dict[str, int]] = {}
    for r in results:
        mod = per.setdefault(str(r["file"]), dict.fromkeys((*OUTCOMES, "total"), 0))
        mod[str(r["outcome"])] += 1
        mod["total"] += 1
    return {
        **{o: sum(r["outcome"] == o for r in results) for o in OUTCOMES},
        "total": len(results),
        "of_all": total,
        "per_module": per,
        "survivors": [
            f"{r['outcome']:9} {r['file']}:{r['line']} {r['what']}" for r in results if r["outcome"] in UNDECIDED
        ],
    }


# A forked child collects every test module it is given before its first test runs, which under load costs
# seconds for a hundred tests; most mutants die in their first few. So a forked mutant runs its tests in
# stages of these sizes (the same tests, in the same order): a kill in the first costs its modules alone.
STAGES = (4, 16)


def _run(worker: Worker, m: Mutant, tests: list[str], seconds: dict[str, float], cap: float) -> dict[str, object]:
    """One mutant against these tests (fastest first, stopping at the first failure)."""
    cuts = [0, *(c for c in STAGES if c < len(tests)), len(tests)] if m.scope else [0, len(tests)]
    spent = 0.0
    for a, b in itertools.pairwise(cuts):
        answer = _run_stage(worker, m, tests[a:b], seconds, cap)
        spent += float(answer["seconds"])  # type: ignore[arg-type]
        if answer["outcome"] != "survived":
            break
    return {**answer, "seconds": round(spent, 2)}


def _run_stage(worker: Worker, m: Mutant, tests: list[str], seconds: dict[str, float], cap: float) -> dict[str, object]:
    # TIMEOUT_FACTOR times the tests' baseline (itself measured under tracing): a mutant that makes a loop
    # slower, or a machine under load, is not killed by the clock alone.
    wanted = TIMEOUT_FACTOR * sum(seconds.get(t, 60.0) for t in tests) + 15
    if not m.scope or m.jit:  # a fresh interpreter imports everything first, or numba compiles the mutant
        wanted += SPAWN_START
    answer = worker.run(m, tests, min(wanted, cap))
    if answer["outcome"] == "timeout" and wanted > cap:
        answer["outcome"] = "capped"  # stopped by --cap, not by its own tests' time: undecided
    return answer


def _kills(results: Iterable[dict[str, object]]) -> dict[tuple[str, str], int]:
    """(module, test) → how many of the module's mutants that test killed (the worker names the killer)."""
    out: dict[tuple[str, str], int] = {}
    for r in results:
        if r.get("killer"):
            key = (str(r["file"]), str(r["killer"]))
            out[key] = out.get(key, 0) + 1
    return out


def _ran_upto(r: dict[str, object]) -> float:
    """The bound up to which a pending mutant's tests have run."""
    return float(r.get("ran_upto", r.get("slow_after", 0.0)))  # type: ignore[arg-type]


def _one(args: argparse.Namespace, every: list[Mutant]) -> None:
    """--mutant FILE:INDEX (repeatable): run those mutants of the working tree against --test (default: the
    tests that cover each, by the cached coverage run) and print each outcome; nothing is recorded. To check
    that a new test kills a survivor."""
    by_name = {f"{m.file}:{m.index}": m for m in every}
    unknown = [name for name in args.mutant if name not in by_name]
    if unknown:
        sys.exit(f"--mutant: no mutant {', '.join(unknown)} (see --survivors for FILE:INDEX)")
    scratch = scratch_copy(REPO, f"check{os.getpid()}")  # beside a run's own copies, never one of them
    lines: dict[str, list[str]] = {}
    seconds: dict[str, float] = {}
    if not args.test:
        all_files = sorted(str(p.relative_to(REPO)) for pattern in TARGETS for p in REPO.glob(pattern))
        lines, seconds = coverage_map(scratch, all_files, args.state)
    worker = Worker(scratch)
    for name in args.mutant:
        m = by_name[name]
        tests = args.test or sorted(covering(m, lines), key=lambda t: seconds.get(t, 60.0))
        answer = worker.run(m, tests, args.cap)
        print(json.dumps({"mutant": f"{m.file}:{m.line} [{m.index}] {m.what}", "tests": len(tests), **answer}))
    worker.close()
    shutil.rmtree(scratch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="modules whose path contains this (repeatable)")
    ap.add_argument("--skip", action="append", default=[], help="leave out modules whose path contains this")
    ap.add_argument("--list", action="store_true", help="count mutants per module and stop")
    ap.add_argument("--state", type=Path, default=REPO / "out" / "mutate", help="coverage cache and results")
    ap.add_argument("--survivors", action="store_true", help="list the survivors recorded so far and stop")
    ap.add_argument("--cap", type=float, default=900, help="at most this many seconds per mutant")
    ap.add_argument(
        "--tiers",
        default="0.5,5",
        help="passes, by each test's time in the coverage run (s): every mutant runs its tests up to the first "
        "bound, then the survivors their tests up to the next, ..., then the rest",
    )
    ap.add_argument("--upto", type=float, default=math.inf, help="stop after the pass with this bound (resume later)")
    ap.add_argument(
        "--mutant", action="append", default=[], help="FILE:INDEX: run this mutant of the working tree (repeatable)"
    )
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at once, each by its own worker and copy")
    ap.add_argument("--test", action="append", default=[], help="with --mutant: the test(s) to run (node ids)")
    ap.add_argument(
        "--settled",
        type=Path,
        help="a file whose lines begin with FILE:INDEX: mutants already decided outside the run (killed by a new "
        "test, checked with --mutant, or argued equivalent), left out of the passes still to run",
    )
    ap.add_argument(
        "--changed-since",
        metavar="REV",
        help="only mutants of code changed since REV (bench/mutate_changed.py: lines `git diff -U0 REV` adds or "
        "changes, but functions moved verbatim)",
    )
    ap.add_argument("--git", type=Path, default=REPO, help="the git repository that knows REV (for a snapshot)")
    args = ap.parse_args()
    files = sorted(
        str(p.relative_to(REPO))
        for pattern in TARGETS
        for p in REPO.glob(pattern)
        if p.name != "__init__.py"
        and (not args.only or any(o in str(p) for o in args.only))
        and not any(s in str(p) for s in args.skip)
    )
    every = mutants(files)
    if args.changed_since:
        every = mutate_changed.select(every, REPO, args.git, args.changed_since, TARGETS)
    if args.list:
        counts: dict[str, int] = {}
        for m in every:
            counts[m.file] = counts.get(m.file, 0) + 1
        print(json.dumps({"total": len(every), "per_module": counts}))
        return
    args.state.mkdir(parents=True, exist_ok=True)
    if args.mutant:
        _one(args, every)
        return
    log = args.state / "results.jsonl"
    done = {}
    if log.exists():
        for line in log.read_text().splitlines():
            r = json.loads(line)
            done[r["key"]] = r  # a later line (the slow pass) supersedes an earlier one
    if args.survivors:
        for m in every:
            r = done.get(m.key)
            if r is not None and r["outcome"] in UNDECIDED:
                text = (REPO / m.file).read_text().splitlines()[m.line - 1].strip()
                print(f"{r['outcome']:9} {m.file}:{m.line} [{m.index}] {m.what} ({r['tests']} tests): {text}")
        return
    scratches = [scratch_copy(REPO, n) for n in range(args.jobs)]
    all_files = sorted(str(p.relative_to(REPO)) for pattern in TARGETS for p in REPO.glob(pattern))
    lines, seconds = coverage_map(scratches[0], all_files, args.state)
    infection = infection_map(scratches[0], all_files, args.state)
    bounds = [*(float(b) for b in args.tiers.split(",")), math.inf]
    bounds = [b for b in bounds if b <= args.upto] or [args.upto]
    # What each mutant has run so far: none, or its tests up to a bound ("pending"); a final outcome ends it.
    ran = {m.key: -1.0 for m in every if m.key not in done}
    ran.update((m.key, _ran_upto(done[m.key])) for m in every if done.get(m.key, {}).get("outcome") == "pending")
    print(
        f"{len(every)} mutants, {len(ran)} to run (of them {sum(v >= 0 for v in ran.values())} pending)",
        file=sys.stderr,
    )
    workers: queue.Queue[Worker] = queue.Queue()
    for scratch in scratches:
        workers.put(Worker(scratch))

    def settled() -> set[str]:
        """FILE:INDEX of the mutants --settled names, read again before each mutant: it grows during a run."""
        if args.settled is None or not args.settled.exists():
            return set()
        return {line.split()[0] for line in args.settled.read_text().splitlines() if line.strip()}

    def run_one(m: Mutant, tests: list[str]) -> dict[str, object] | None:
        # decided outside the run after its first pass: its slower tests would only say whether the suite
        # kills it too (it stays `pending` in the results)
        if ran[m.key] >= 0 and f"{m.file}:{m.index}" in settled():
            return None
        worker = workers.get()  # each worker (and its scratch copy) runs one mutant at a time
        try:
            return _run(worker, m, tests, seconds, args.cap)
        finally:
            workers.put(worker)

    with log.open("a") as out, ThreadPoolExecutor(args.jobs) as pool:
        for bound in bounds:
            # smaller modules first: a pass cut short leaves whole modules decided rather than parts of all
            size = {f: sum(m.file == f for m in every) for f in files}
            todo = sorted((m for m in every if m.key in ran and ran[m.key] < bound), key=lambda m: size[m.file])
            began = time.monotonic()
            jobs: dict[Future[dict[str, object] | None], tuple[Mutant, list[str], list[str]]] = {}
            kills = _kills(done.values())
            for m in todo:
                covered = covering(m, lines)
                tests = sorted(infection.narrow(m, covered), key=lambda t: seconds.get(t, 60.0))
                these = [t for t in tests if ran[m.key] < seconds.get(t, 60.0) <= bound]
                # a survivor runs them all anyway; a mutant that dies, sooner by the tests that killed most
                # mutants of its module so far, per second of their time
                these.sort(key=lambda t: seconds.get(t, 60.0) / (1 + kills.get((m.file, t), 0)))
                later = [t for t in tests if seconds.get(t, 60.0) > bound]
                if covered and these:
                    job = pool.submit(run_one, m, these)
                else:  # "uninfected": tests run its line, but none gives it another value there
                    job = Future()
                    mode = "-" if tests or not covered else "uninfected"
                    job.set_result({"outcome": "survived" if covered else "uncovered", "seconds": 0.0, "mode": mode})
                jobs[job] = (m, these, later)
            for n, job in enumerate(as_completed(jobs), 1):
                m, these, later = jobs[job]
                answer = job.result()
                if answer is None:
                    continue
                if answer["outcome"] == "survived" and later:
                    answer["outcome"] = "pending"  # so far: its slower tests run in a later pass
                    ran[m.key] = bound
                else:
                    del ran[m.key]
                r = {**asdict(m), "key": m.key, "ran_upto": bound if later else None, "tests": len(these), **answer}
                done[m.key] = r
                out.write(json.dumps(r) + "\n")
                out.flush()
                eta = (time.monotonic() - began) / n * (len(todo) - n) / 60
                print(
                    f"[≤{bound:g}s {n}/{len(todo)} eta {eta:.0f}m] {r['outcome']:9} {r['seconds']:6.1f}s "
                    f"{len(these):4} tests {r['mode']} {m.file}:{m.line} {m.what}",
                    file=sys.stderr,
                    flush=True,
                )
    while not workers.empty():
        workers.get().close()
    for scratch in scratches:
        shutil.rmtree(scratch)
    print(json.dumps(summarize([done[m.key] for m in every], len(every))))


if __name__ == "__main__":
    main()
