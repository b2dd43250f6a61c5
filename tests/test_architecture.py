"""The layering docs/architecture.md promises, checked over the import graph of src/fairgpu: no cycles
(type-only imports included), a pure engine, drivers that depend on the engine and never on each other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
ENGINE = (
    "fairgpu.model",
    "fairgpu.state",
    "fairgpu.state_kernels",
    "fairgpu.mig_slices",
    "fairgpu.dry_run",
    "fairgpu.changes",
    "fairgpu.fairness",
    "fairgpu.framework",
    "fairgpu.plugins",
)
# What the engine may import from fairgpu besides itself: driver-neutral data and errors.
ENGINE_MAY_USE = ("fairgpu.resources", "fairgpu.errors", "fairgpu.spec")
DRIVERS = ("fairgpu.sim", "fairgpu.k8s")
# The engine never does I/O and never reads a clock.
IO_MODULES = {"time", "asyncio", "os", "socket", "pathlib", "subprocess", "threading", "datetime", "random", "yaml"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module a file imports, wherever the import statement is (inside functions and TYPE_CHECKING
    blocks too: a type-only cycle is still a cycle a reader must untangle)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in SRC.joinpath("fairgpu").rglob("*.py")}
    # The root package (a version string) is left out: every `from fairgpu import x` would point at it.
    return {
        name: {m for m in _imports(path) if m in files and m not in (name, "fairgpu")} for name, path in files.items()
    }


GRAPH = _graph()


def _within(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def test_the_graph_is_read():
    assert "fairgpu.framework.scheduler" in GRAPH["fairgpu.sim.runner"]
    assert "fairgpu.framework.interfaces" in GRAPH["fairgpu.plugins.fit"]
    assert len(GRAPH) > 50


def test_no_import_cycles():
    order: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for dep in sorted(GRAPH[m]):
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, [*path, dep])
        state[m] = 2
        order.append(m)

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [m])


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if _within(m, ENGINE)))
def test_the_engine_is_pure(module):
    path = SRC.joinpath(*module.split(".")).with_suffix(".py")
    if not path.exists():
        path = SRC.joinpath(*module.split("."), "__init__.py")
    outside = {d for d in GRAPH[module] if not _within(d, ENGINE + ENGINE_MAY_USE)}
    assert not outside, f"{module} imports {sorted(outside)}"
    io = {m.split(".")[0] for m in _imports(path)} & IO_MODULES
    assert not io, f"{module} imports {sorted(io)}: the engine does no I/O and reads no clock"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if _within(m, ("fairgpu.framework",))))
def test_the_framework_never_imports_plugins(module):
    assert not {d for d in GRAPH[module] if _within(d, ("fairgpu.plugins",))}


@pytest.mark.parametrize(
    "module", sorted(m for m in GRAPH if _within(m, (*DRIVERS, "fairgpu.observe", "fairgpu.twin")))
)
def test_drivers_never_import_each_other(module):
    mine = next((d for d in DRIVERS if _within(module, (d,))), None)
    others = tuple(d for d in DRIVERS if d != mine)  # observe/ and twin/ (what both drivers share) import neither
    assert not {d for d in GRAPH[module] if _within(d, others)}, f"{module} imports another driver"


def test_the_worked_plugin_example_in_docs_runs(monkeypatch):
    """docs/architecture.md's "How to add a plugin" example, registered and used as the page says: the
    labelled node gets no pod though it is the emptier one."""
    import sys
    import types

    from conftest import gpu_node, job, tree, whole
    from fairgpu.framework.interfaces import Filter
    from fairgpu.framework.profile import PluginEntry, parse_profile
    from fairgpu.framework.scheduler import Scheduler
    from fairgpu.plugins.registry import IN_TREE

    page = (SRC.parent / "docs" / "architecture.md").read_text()
    code = re.search(r"```python\n(# src/fairgpu/plugins/maintenance.py\n.*?)```", page, re.S).group(1)
    module = types.ModuleType("maintenance")
    monkeypatch.setitem(sys.modules, "maintenance", module)  # dataclasses look their module up
    exec(compile(code, "docs/architecture.md", "exec"), module.__dict__)
    registry = {**IN_TREE, "Maintenance": PluginEntry(Filter, module.Maintenance)}
    profile = parse_profile(
        {"name": "m", "queueSort": "FairShare", "filter": ["NodeAffinity", "Maintenance", "GpuType", "Resources"],
         "score": ["LeastAllocated"]},
        registry,
    )  # fmt: skip
    busy, soon = gpu_node("busy", cpu_m=8000), gpu_node("soon", labels={"maintenance": "soon"})
    sched = Scheduler([busy, soon], tree("a"), profile)
    sched.submit(job("w", "a", whole(1)))
    result = sched.cycle(0.0)
    assert [sched.state.node_names[b.placement.node] for b in result.bound] == ["busy"]
    with pytest.raises(Exception, match="Maintenance is a Filter plugin, not Score"):
        parse_profile({"name": "m", "queueSort": "FairShare", "score": ["Maintenance"]}, registry)


def test_every_type_ignore_names_its_code_and_reason():
    """A silenced type error says which error and why, on the same line: `# type: ignore[code]  # why`."""
    bare = []
    for path in SRC.joinpath("fairgpu").rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "type: ignore" in line and not re.search(r"type: ignore\[[\w-]+(, [\w-]+)*\]\s+#\s*\S", line):
                bare.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert not bare, "\n".join(bare)
