"""The long-lived side of bench/mutate.py, run inside the scratch copy: it imports pytest and all of fairgpu
once, then for each mutant (one JSON line on stdin) writes the mutated file (for tests that start fairgpu in
a subprocess), forks, and in the child swaps the mutated function's code into every function object made
from it before running the tests in-process with pytest.main. A mutant outside any function body (a module
constant, a class attribute, a default) cannot be swapped in that way and runs in a fresh interpreter instead.
In a function numba compiles, the child replaces the module's compiled function by one numba compiles from the
mutated code, and every module's name for it (callers reach it through the module, as `kernels.name`, or by
a name of their own, `from ... import book`); the others were loaded once, before
forking, from numba's on-disk cache (keyed by the source's content, so valid again once the file is restored),
so a child compiles only the mutant.
Answers one JSON line per mutant: outcome (killed, timeout, survived, error), seconds, mode (fork, jit, spawn),
and for a kill the test that failed (`killer`, from pytest's JUnit report).
"""

from __future__ import annotations

import ast
import contextlib
import gc
import importlib
import json
import os
import pkgutil
import signal
import subprocess
import sys
import time
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import fairgpu
from mutate import mutated_tree

ROOT = Path.cwd()
PYTEST_ARGS = ["-x", "-q", "--no-header", "-p", "no:cacheprovider", "-o", "addopts=", "--hypothesis-profile=mutation"]
REPORT = ROOT / ".mutate-report.xml"  # each run's JUnit report: which test killed the mutant


def _preimport() -> dict[tuple[str, str], list[types.FunctionType]]:
    """Import every fairgpu module and the tests' heavy libraries (so a child imports only the test modules),
    then index fairgpu's function objects by (file, qualified name)."""
    sys.path[:0] = ["", str(ROOT / "tests")]  # "" as under `python -m pytest`: tests import `tests.conftest`
    for name in ("hypothesis", "fakeapi.server"):
        importlib.import_module(name)
    for info in pkgutil.walk_packages(fairgpu.__path__, "fairgpu."):
        if info.name.endswith(".__main__"):  # runs the CLI
            continue
        try:
            with contextlib.redirect_stdout(sys.stderr):  # stdout carries the answers
                importlib.import_module(info.name)
        except Exception:  # an optional driver's missing extra: its tests cannot run it either
            continue
    index: dict[tuple[str, str], list[types.FunctionType]] = {}
    for obj in gc.get_objects():
        if isinstance(obj, types.FunctionType) and obj.__code__.co_filename.startswith(str(ROOT)):
            index.setdefault((obj.__code__.co_filename, obj.__code__.co_qualname), []).append(obj)
    return index


def _load_compiled() -> None:
    """Load every compiled signature in numba's on-disk cache of fairgpu's compiled functions into this process,
    so forked children inherit them instead of compiling each again (the mutated file on disk at that time
    makes the cache miss). Best effort, through numba's private cache API: what is not loaded is compiled in
    the child, the same code more slowly."""
    try:
        from numba.core.dispatcher import Dispatcher
    except ImportError:
        return
    for name, module in list(sys.modules.items()):
        if not name.startswith("fairgpu."):
            continue
        for obj in list(vars(module).values()):
            if isinstance(obj, Dispatcher) and obj._cache is not None:
                with contextlib.suppress(Exception):
                    for key in obj._cache._cache_file._load_index():
                        obj.compile(key[0])


def _module_of(path: Path) -> types.ModuleType | None:
    return next((m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == str(path)), None)


def _code_named(code: types.CodeType, qualname: str) -> types.CodeType | None:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_qualname == qualname:
                return const
            found = _code_named(const, qualname)
            if found is not None:
                return found
    return None


# The tests' process died of a memory fault: the suite fails as loudly as by a failed assert (a numba kernel
# checks no bounds, so a mutated index reads past an array). Never the harness's doing, unlike a SIGKILL.
CRASHES = {-signal.SIGSEGV: "SIGSEGV", -signal.SIGBUS: "SIGBUS"}


def _outcome(status: int | None) -> str:
    if status is None:
        return "timeout"
    if status in CRASHES:
        return "killed"
    # 0 all passed; 1 a test failed; otherwise interrupted (a collection error), internal, usage or nothing
    # collected: the harness's fault more likely than the mutant's, so never counted as a kill
    return {0: "survived", 1: "killed"}.get(status, "error")


def _wait(pid: int, timeout: float) -> int | None:
    """The child's exit code, or None after killing its process group at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            _kill_group(pid)  # servers or subprocesses a test left behind
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    _kill_group(pid)
    os.waitpid(pid, 0)
    return None


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _recompile_callers(module: types.ModuleType, name: str) -> None:
    """A compiled caller binds the kernels it calls when it is compiled (loaded from numba's cache before the
    fork, with the original): give every kernel of the module that reaches `name`, directly or through others,
    a fresh dispatcher, compiled at its first call against the module's globals, where `name` is the mutant.
    Without it a mutant of a kernel called only from other kernels ran in no test and survived unseen."""
    from numba.core.registry import CPUDispatcher

    kernels = {k: v for k, v in vars(module).items() if isinstance(v, CPUDispatcher) and k != name}
    reached, grew = {name}, True
    while grew:
        callers = {k for k, v in kernels.items() if k not in reached and reached & set(v.py_func.__code__.co_names)}
        reached |= callers
        grew = bool(callers)
    from numba import njit

    for k in reached - {name}:
        f = kernels[k].py_func
        setattr(module, k, njit(types.FunctionType(f.__code__, vars(module), k, f.__defaults__)))


def _swap_compiled(module: types.ModuleType, code: types.CodeType) -> None:
    """Numba compiles the mutated function `code` (not cached: the cache is the original's) in place of the
    module's, and its callers against it; every fairgpu module's name for a function replaced then names the
    replacement: a module that imported a kernel by name (state.py's `from fairgpu.state_kernels import book`)
    held the original, so every mutant of `book` ran in no test and survived unseen."""
    from numba import njit

    name = code.co_name
    before = dict(vars(module))
    setattr(
        module, name, njit(types.FunctionType(code, vars(module), name, getattr(module, name).py_func.__defaults__))
    )
    _recompile_callers(module, name)
    replaced = {id(v): vars(module)[k] for k, v in before.items() if vars(module)[k] is not v}
    for mod_name, mod in list(sys.modules.items()):
        if mod is not module and (mod_name == "fairgpu" or mod_name.startswith("fairgpu.")):
            for k, v in list(vars(mod).items()):
                if id(v) in replaced:
                    setattr(mod, k, replaced[id(v)])


def _fork(
    funcs: list[types.FunctionType],
    code: types.CodeType,
    tests: list[str],
    timeout: float,
    jit: types.ModuleType | None,
) -> int | None:
    pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 3
        try:
            os.setpgid(0, 0)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            if jit is not None:
                _swap_compiled(jit, code)
            for f in funcs:
                f.__code__ = code
            status = int(pytest.main([*PYTEST_ARGS, f"--junitxml={REPORT}", *tests]))
        finally:
            os._exit(status)
    return _wait(pid, timeout)


def _spawn(tests: list[str], timeout: float) -> int | None:
    cmd = [sys.executable, "-m", "pytest", *PYTEST_ARGS, f"--junitxml={REPORT}", *tests]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        proc.wait()
        return None


def _killer() -> str | None:
    """The node id (parameters dropped, as the coverage map has it) of the test that failed in the last run."""
    try:
        root = ET.parse(REPORT).getroot()
    except (OSError, ET.ParseError):
        return None
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            return f"tests/{case.get('classname', '').split('.')[-1]}.py::{case.get('name', '').split('[')[0]}"
    return None


def run(request: dict[str, object], index: dict[tuple[str, str], list[types.FunctionType]]) -> dict[str, object]:
    file, scope = str(request["file"]), str(request["scope"])
    tests, timeout = [str(t) for t in request["tests"]], float(request["timeout"])  # type: ignore[attr-defined]
    path = ROOT / file
    original = path.read_text()
    tree = mutated_tree(ROOT, file, int(request["index"]))  # type: ignore[call-overload]
    jit = _module_of(path) if request.get("jit") else None
    funcs = index.get((str(path), scope), []) if scope and jit is None else []
    code = _code_named(compile(tree, str(path), "exec"), scope) if funcs or jit else None
    swappable = code is not None and all(len(f.__code__.co_freevars) == len(code.co_freevars) for f in funcs)
    began = time.monotonic()
    REPORT.unlink(missing_ok=True)
    try:
        path.write_text(ast.unparse(tree))
        status = _fork(funcs, code, tests, timeout, jit) if swappable and code else _spawn(tests, timeout)
    finally:
        path.write_text(original)
    mode = ("jit" if jit else "fork") if swappable else "spawn"
    seconds = round(time.monotonic() - began, 2)
    answer: dict[str, object] = {"outcome": _outcome(status), "seconds": seconds, "mode": mode}
    if answer["outcome"] == "killed":
        answer["killer"] = f"crash ({CRASHES[status]})" if status in CRASHES else _killer()
    return answer


def _compile_tests() -> None:
    """Bytecode for the tests, written once: PYTHONDONTWRITEBYTECODE (set so no stale .pyc of a mutated source
    is ever read) would otherwise make every child compile, and pytest re-rewrite the asserts of, each test
    module it imports. Tests are never mutated, so theirs cannot go stale; the run is a subprocess so that this
    process imports no test module (a child imports them after its swap, as their module-level code may call
    the mutated function)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    tests = sorted(str(p) for p in (ROOT / "tests").glob("test_*.py"))
    for cmd in (["compileall", "-q", str(ROOT / "tests")], ["pytest", "--collect-only", *PYTEST_ARGS[1:], *tests]):
        subprocess.run([sys.executable, "-m", *cmd], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def main() -> None:
    _compile_tests()
    index = _preimport()
    # What is imported now is never freed: out of the collector's sight, each child's pytest (which collects
    # twice at exit) no longer walks all of it, and the children share its pages instead of copying them.
    _load_compiled()
    gc.freeze()
    for line in sys.stdin:
        print(json.dumps(run(json.loads(line), index)), flush=True)


if __name__ == "__main__":
    main()
