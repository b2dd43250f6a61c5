"""bench/mutate.py's infection filter: a test is dropped for a mutant only when the mutated node never gives
another value in it (bench/mutate_infect.py), and what counts as "another value"."""

from __future__ import annotations

import builtins
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from mutate import Infection, Mutant, mutants, mutated_tree
from mutate_changed import select
from mutate_infect import Probe, _same, probed_tree

SOURCE = """
def f(x, y):
    return (x + y, x >= y)
"""


def test_same_means_bit_for_bit_in_type_dtype_and_shape():
    assert _same(1.0, 1.0) and _same(float("nan"), float("nan"))
    assert not _same(0.0, -0.0) and not _same(1, 1.0) and not _same(True, 1)
    assert _same(np.array([1.0, 2.0]), np.array([1.0, 2.0]))
    assert not _same(np.array([1.0, 2.0]), np.array([1, 2]))  # dtype
    assert not _same(np.zeros(2), np.zeros((2, 1)))  # shape
    assert not _same((1.0, 0.0), (1.0, -0.0))


def test_a_probe_returns_the_original_and_records_the_tests_whose_values_differ(tmp_path, monkeypatch):
    """`x + y` → `x - y` differs unless y is 0; `x >= y` → `x > y` only where x equals y."""
    (tmp_path / "m.py").write_text(SOURCE)
    ops, ids = {}, {}
    code = compile(probed_tree(tmp_path / "m.py", "m.py", ops, ids), "m.py", "exec")
    add, ge = ids["m.py:0"], ids["m.py:1"]
    probe = Probe(ops)
    monkeypatch.setattr(builtins, "__mutprobe__", probe, raising=False)
    space: dict = {}
    exec(code, space)
    for test, args in (("t_zero", (3, 0)), ("t_equal", (2, 2)), ("t_other", (5, 1))):
        probe.test, probe.current = test, probe.infected.setdefault(test, set())
        assert space["f"](*args) == (args[0] + args[1], args[0] >= args[1])
    assert probe.infected == {"t_zero": set(), "t_equal": {add, ge}, "t_other": {add}}


def test_only_tests_that_infect_a_probed_mutant_are_run_against_it(tmp_path):
    (tmp_path / "m.py").write_text(SOURCE)
    add = next(m for m in mutants(["m.py"], tmp_path) if m.what == "Add -> Sub")
    inf = Infection({"m.py:0": 0}, {"t_zero": set(), "t_other": {0}}, failed={"t_failed"})
    # not infected: dropped; infected, failed under the probes, or never seen by them: kept
    assert inf.narrow(add, {"t_zero", "t_other", "t_failed", "t_unseen"}) == {"t_other", "t_failed", "t_unseen"}
    unprobed = Mutant("m.py", 3, 2, "1 -> 0", "f", ("m.py:3",), add.digest)
    assert inf.narrow(unprobed, {"t_zero"}) == {"t_zero"}


@pytest.mark.parametrize("rhs", ["iter([1, 2])", "(i for i in [1, 2])"])
def test_a_mutated_in_never_searches_an_iterator_again(rhs):
    """`x in it` consumes `it`: the probe counts the mutant as infecting instead of searching it twice."""
    import ast

    from mutate_infect import _OPS, _once

    it = eval(rhs)
    assert _OPS[ast.In](1, it) is True
    with pytest.raises(TypeError):
        _once(_OPS[ast.NotIn])(2, it)
    assert next(it) == 2  # what the original left is still there


OLD_A = """LIMIT = 3


def kept(x):
    return x + 1


def edited(x, y):
    total = x * y
    return (total > LIMIT,
            x)


def guarded(x):
    y = x - 1
    if y < 0:
        return 0
    return y * 3


class Box:
    def moved(self, v):
        \"\"\"Doc.\"\"\"
        return v - 2
"""
NEW_A = """LIMIT = 4


def kept(x):
    return x + 1


def edited(x, y):
    total = x * y
    return (total > LIMIT,
            y)


def guarded(x):
    y = x - 1
    return y * 3
"""
NEW_B = """class Crate:
    def moved(self, v):
        \"\"\"Doc, reworded on the way.\"\"\"
        # and a comment
        return v - 2


def fresh(z):
    return z * 5
"""


def test_changed_since_mutates_changed_statements_and_deletions_borders_not_code_moved_verbatim(tmp_path):
    """`--changed-since REV`: a changed line selects every mutant of its statement (also one on a line of it
    that is as it was), a deleted guard its two neighbours, a new file all of it; a function moved to another
    module and class with only its docstring and comments changed, and unchanged code, none."""

    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True, capture_output=True
        )

    (tmp_path / "pol").mkdir()
    (tmp_path / "pol" / "a.py").write_text(OLD_A)
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "old")
    (tmp_path / "pol" / "a.py").write_text(NEW_A)
    (tmp_path / "pol" / "b.py").write_text(NEW_B)
    every = mutants(["pol/a.py", "pol/b.py"], tmp_path)
    chosen = select(every, tmp_path, tmp_path, "HEAD", ("pol/*.py",))
    assert sorted((m.file, m.scope or "-", m.what) for m in chosen) == [
        ("pol/a.py", "-", "4 -> 8"),  # a module constant changed
        ("pol/a.py", "edited", "Gt -> GtE"),  # its statement's second line changed
        ("pol/a.py", "guarded", "1 -> 0"),  # `y = x - 1`: before the deleted guard
        ("pol/a.py", "guarded", "3 -> 6"),  # `return y * 3`: after it
        ("pol/a.py", "guarded", "Mult -> Div"),
        ("pol/a.py", "guarded", "Sub -> Add"),
        ("pol/b.py", "fresh", "5 -> 10"),  # a new function
        ("pol/b.py", "fresh", "Mult -> Div"),
    ]
    assert {m.what for m in every} - {m.what for m in chosen} >= {"Add -> Sub", "2 -> 4"}  # kept, moved


def test_a_compiled_mutant_replaces_the_kernel_under_every_name_a_module_holds(monkeypatch):
    """state.py calls `book` by a name of its own (`from fairgpu.state_kernels import book`): a mutant swapped
    into state_kernels alone ran in no test, and all 105 of `book`'s survived until the worker renamed it."""
    import mutate_worker
    from fairgpu import state, state_kernels

    root, file = Path(__file__).resolve().parent.parent, "src/fairgpu/state_kernels.py"
    original = state_kernels.book
    monkeypatch.setattr(state_kernels, "book", original)  # restored after the test
    monkeypatch.setattr(state, "book", original)
    m = next(m for m in mutants([file], root) if m.scope == "book")
    code = mutate_worker._code_named(compile(mutated_tree(root, file, m.index), str(root / file), "exec"), "book")
    assert code is not None
    mutate_worker._swap_compiled(state_kernels, code)
    assert state.book is state_kernels.book and state.book is not original
    assert state.book.py_func.__code__ is code
