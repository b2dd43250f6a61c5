"""One-line messages on stderr, shared by the `fairgpu` command and the kubectl plugin."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape


def fail(message: str) -> typer.Exit:
    """The one-line error every command gives for bad input: raise what this returns (exit status 2)."""
    Console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def note(message: str) -> None:
    Console(stderr=True).print(escape(message), highlight=False, soft_wrap=True)
