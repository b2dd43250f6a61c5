"""The `fairgpu` app, and what its commands share: one-line errors, notes on stderr, checks made before a
long run."""

from __future__ import annotations

import os
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import Annotated

import typer

from fairgpu.errors import ScenarioError
from fairgpu.spec import parse_duration

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Fair-share GPU scheduling for Kubernetes.",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)
DEFAULT_PROFILES = ("kube-default", "fairgpu")
TRACE_HORIZON = "14d"  # a trace's default window: the whole Philly trace (~125 days) takes ~25 minutes
MAX_SEEDS = 1000
IDLE_UTILIZATION = 0.05  # below this a replay says the cluster sat mostly idle


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"fairgpu {metadata.version('fairgpu')}\n")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Fair-share GPU scheduling for Kubernetes."""


def check_output(option: str, path: Path, suffixes: tuple[str, ...]) -> None:
    """Before a long run, not after it: the folder must exist and be writable."""
    if suffixes and path.suffix not in suffixes:
        raise ScenarioError(f"{option}: {path} must end in {' or '.join(suffixes)}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ScenarioError(f"{option}: folder {folder} does not exist")
    if path.is_dir():
        raise ScenarioError(f"{option}: {path} is a folder; give a file name")
    if not os.access(folder, os.W_OK):
        raise ScenarioError(f"{option}: folder {folder} is not writable")


def check_port(host: str, port: int, option: str = "--port") -> None:
    """A bad or busy port is refused before anything starts (uvicorn would fail after the banner)."""
    if not 0 < port < 65536:
        raise ScenarioError(f"{option}: {port} is not a port number (1-65535)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise ScenarioError(f"--host: {host!r} is not an address of this machine") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as err:
            raise ScenarioError(f"{option}: cannot listen on {host}:{port}: {err.strerror}") from None


def option_duration(option: str, value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as err:
        raise ScenarioError(f"{option}: {err}") from None
