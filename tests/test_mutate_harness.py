"""bench/mutate.py's infection filter: a test is dropped for a mutant only when the mutated node never gives
another value in it (bench/mutate_infect.py), and what counts as "another value"."""

from __future__ import annotations

import builtins
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from mutate import Infection, Mutant, mutants
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
