"""bench/mutate.py's infection run, inside the scratch copy: the suite in-process once, with every operator
mutant of the policy modules present as a probe, to record which tests *infect* it: evaluate its node to a
value other than the original's. A probe computes the original operation and returns its value (the suite
runs the unmutated code), and also computes the mutated operation on the same operands, evaluated once.
A test that never infects a mutant runs exactly as it would under that mutant (every evaluation of the
changed node gives the same value, so nothing downstream differs), so it cannot kill it: bench/mutate.py
then runs it against only the tests that infect it. Only binary operators and single comparisons are
probed; the other mutants (constants, `not`, `and`/`or`, augmented assignments) keep all their covering
tests. Tests that fail or error here are listed, and keep all their covering tests too.

    python bench/mutate_infect.py OUT.json FILE,FILE... PYTEST_ARGS...
"""

from __future__ import annotations

import ast
import builtins
import importlib.machinery
import json
import math
import operator
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mutate import FLIP, _mutable, _scopes

_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


def _once(fn: Any) -> Any:
    """A mutated `in` must not consume an iterator the original already searched: it counts as changed."""

    def mutated(a: object, b: Any) -> object:
        if hasattr(b, "__next__"):
            raise TypeError("an iterator: searching it again would consume it")
        return fn(a, b)

    return mutated


def _same(a: object, b: object) -> bool:
    """The same value to every later computation: same type, and equal bit for bit (-0.0 is not 0.0, NaN
    is NaN); an array also in dtype and shape."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray)
        return a.dtype == b.dtype and a.shape == b.shape and a.dtype != object and a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.tobytes() == b.tobytes()  # type: ignore[attr-defined]  # same type as a
    if isinstance(a, float):
        return math.copysign(1.0, a) == math.copysign(1.0, b) and (a == b or (a != a and b != b))  # type: ignore[arg-type]  # float too
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=False))  # type: ignore[arg-type]  # same type
    try:
        return bool(a == b)
    except Exception:  # an object that cannot say: count it as changed
        return False


class Probe:
    """builtins.__mutprobe__: each probed node calls it with its operands."""

    def __init__(self, ops: dict[int, tuple[Any, Any]]) -> None:
        self.ops = ops  # probe id → (original operation, mutated one)
        self.test = ""
        self.infected: dict[str, set[int]] = {}
        self.current: set[int] = set()

    def __call__(self, pid: int, a: object, b: object) -> object:
        orig, mutated = self.ops[pid]
        value = orig(a, b)
        if self.test and pid not in self.current:
            try:
                with np.errstate(all="ignore"):
                    other = mutated(a, b)
            except Exception:  # the mutant raises where the original does not
                self.current.add(pid)
            else:
                if not _same(value, other):
                    self.current.add(pid)
        return value


class _Rewrite(ast.NodeTransformer):
    """Each probed node → __mutprobe__(id, left, right), at the node's own location."""

    def __init__(self, probed: dict[int, int]) -> None:
        self.probed = probed  # id(node) → probe id

    def visit(self, node: ast.AST) -> ast.AST:
        pid = self.probed.get(id(node))
        node = self.generic_visit(node)
        if pid is None:
            return node
        if isinstance(node, ast.BinOp):
            left, right = node.left, node.right
        else:
            assert isinstance(node, ast.Compare)
            left, right = node.left, node.comparators[0]
        call = ast.Call(ast.Name("__mutprobe__", ast.Load()), [ast.Constant(pid), left, right], [])
        return ast.copy_location(call, node)


def probed_tree(path: Path, rel: str, ops: dict[int, tuple[Any, Any]], ids: dict[str, int]) -> ast.Module:
    """The module with every probe-able mutant (in a function body) replaced by a probe; fills `ops` and
    `ids` ("file:index" → probe id)."""
    tree = ast.parse(path.read_text())
    scopes = _scopes(tree)
    compiled = {  # numba compiles these from their source: a probe there is a typing error
        id(n)
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in f.decorator_list)
        for n in ast.walk(f)
    }
    probed: dict[int, int] = {}
    for i, (node, _) in enumerate(_mutable(tree)):
        if not scopes.get(id(node)) or id(node) in compiled:
            continue
        if isinstance(node, ast.BinOp) and type(node.op) in FLIP:
            op = type(node.op)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in FLIP:
            op = type(node.ops[0])
        else:
            continue
        pid = len(ops)
        ops[pid] = (_OPS[op], _once(_OPS[FLIP[op]]) if op in (ast.In, ast.NotIn) else _OPS[FLIP[op]])
        ids[f"{rel}:{i}"] = pid
        probed[id(node)] = pid
    return ast.fix_missing_locations(_Rewrite(probed).visit(tree))


def main() -> None:
    sys.path.insert(0, "")  # as `python -m pytest` has it: the tests import `tests.conftest`
    out, files, args = Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3:]
    root = Path.cwd()
    ops: dict[int, tuple[Any, Any]] = {}
    ids: dict[str, int] = {}
    trees = {str(root / rel): probed_tree(root / rel, rel, ops, ids) for rel in files}
    probe = Probe(ops)
    builtins.__mutprobe__ = probe  # type: ignore[attr-defined]  # what the probed modules call

    probed: list[str] = []

    class Loader(importlib.machinery.SourceFileLoader):
        def get_code(self, fullname: str) -> Any:
            path = self.get_filename(fullname)
            if path in trees:  # never from a .pyc: that is the unprobed code
                probed.append(path)
                return compile(trees[path], path, "exec")
            return super().get_code(fullname)

    m = importlib.machinery
    finder = m.FileFinder.path_hook(
        (m.ExtensionFileLoader, m.EXTENSION_SUFFIXES),
        (Loader, m.SOURCE_SUFFIXES),
        (m.SourcelessFileLoader, m.BYTECODE_SUFFIXES),
    )
    sys.path_hooks.insert(0, finder)
    sys.path_importer_cache.clear()
    failed: list[str] = []

    class Contexts:
        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_setup(self, item: pytest.Item) -> None:
            probe.test = item.nodeid.split("[")[0]  # a test's parameters run together
            probe.current = probe.infected.setdefault(probe.test, set())

        def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
            if report.failed:
                failed.append(report.nodeid.split("[")[0])

        def pytest_runtest_logfinish(self, nodeid: str) -> None:
            probe.test = ""

    status = pytest.main(args, plugins=[Contexts()])
    # imported, but not through the hook: their mutants' tests must not be narrowed (should be none)
    loaded = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
    unprobed = sorted(str(Path(f).relative_to(root)) for f in trees if f in loaded and f not in probed)
    out.write_text(
        json.dumps(
            {
                "ids": ids,
                "infected": {t: sorted(s) for t, s in probe.infected.items()},
                "failed": sorted(set(failed)),
                "unprobed": unprobed,
                "status": int(status),
            }
        )
    )


if __name__ == "__main__":
    main()
