"""bench/mutate.py --changed-since REV: only the mutants of code changed since REV.

A mutant is selected when its statement (a compound statement's header, not its body) overlaps a line that
`git diff -U0` of its file against REV adds or changes (every line of a file new since REV), or borders a
deletion (a guard removed between two lines changes what both do). Code moved verbatim is not "changed":
a mutant is left out when its outermost function is, but for its docstring and comments, a function of the
same name in one of REV's policy modules (a split that moves a function to a new module, or to another
class, adds all its lines). Anything else a move touched (a constant or class attribute, a function changed
on the way) is mutated: a module-level name's readers may have changed, which its text alone cannot tell.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol


class _Mutant(Protocol):
    file: str
    scope: str  # qualified name of its outermost function, "" outside any
    span: tuple[int, int]  # first and last line of its statement (a compound statement's header)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def _old_text(repo: Path, rev: str, file: str) -> str | None:
    done = subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{file}"], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", re.MULTILINE)


def changed_lines(old: str | None, new: str) -> set[int]:
    """Lines of `new` that `git diff -U0` adds or changes against `old` (all when there is no `old`), and
    the two lines around each pure deletion."""
    if old is None:
        return set(range(1, new.count("\n") + 2))
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp, "a"), Path(tmp, "b")
        a.write_text(old)
        b.write_text(new)
        diff = subprocess.run(
            ["git", "diff", "--no-index", "--no-color", "-U0", "--diff-algorithm=histogram", str(a), str(b)],
            capture_output=True,
            text=True,
        ).stdout
    out: set[int] = set()
    for m in _HUNK.finditer(diff):
        start, count = int(m.group(1)), int(m.group(2) if m.group(2) is not None else 1)
        # a deletion after line `start`: both neighbours count
        out.update(range(start, start + count) if count else (start, start + 1))
    return out


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Qualified name → outermost function (methods as Class.name), as mutate._scopes names them."""
    out: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                out[prefix + stmt.name] = stmt
            elif isinstance(stmt, ast.ClassDef):
                walk(stmt.body, f"{prefix}{stmt.name}.")

    walk(tree.body, "")
    return out


def _code(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The function as code: its AST without positions, docstrings (its own and nested ones') or comments."""
    fn = ast.parse(ast.unparse(fn)).body[0]  # type: ignore[assignment]  # a private copy, as code
    for node in ast.walk(fn):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(fn)


def old_functions(repo: Path, rev: str, targets: Iterable[str]) -> set[str]:
    """The code (_code) of every outermost function of REV's policy modules."""
    patterns = list(targets)
    files = [f for f in _git(repo, "ls-tree", "-r", "--name-only", rev).splitlines() if f.endswith(".py")]
    out: set[str] = set()
    for f in files:
        if any(fnmatch.fnmatch(f, p) for p in patterns):
            out.update(_code(fn) for fn in _functions(ast.parse(_old_text(repo, rev, f) or "")).values())
    return out


def select(mutants: list[_Mutant], root: Path, repo: Path, rev: str, targets: Iterable[str]) -> list[_Mutant]:
    """The mutants of code changed since `rev` (see the module's docstring). `root` holds the files mutated
    (a snapshot, say); `repo` is the git repository that knows `rev`."""
    old = old_functions(repo, rev, targets)
    lines: dict[str, set[int]] = {}
    moved: dict[str, set[str]] = {}
    out = []
    for m in mutants:
        if m.file not in lines:
            text = (root / m.file).read_text()
            lines[m.file] = changed_lines(_old_text(repo, rev, m.file), text)
            functions = _functions(ast.parse(text))
            moved[m.file] = {name for name, fn in functions.items() if _code(fn) in old}
        if m.scope in moved[m.file]:
            continue
        if any(ln in lines[m.file] for ln in range(m.span[0], m.span[1] + 1)):
            out.append(m)
    return out
