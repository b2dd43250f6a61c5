"""Headless Chromium for the dashboard and report tests: Debian's package (installed when missing, as CI
starts from a fresh machine), driven by Playwright, with every request that leaves localhost recorded."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
SCREENSHOTS = Path(__file__).resolve().parent.parent / "out" / "screenshots"


def ensure_chromium() -> str:
    """Install Debian's chromium if it is missing (CI runs as root on a fresh machine)."""
    if not Path(CHROMIUM).exists():
        if shutil.which("apt-get") is None:
            raise RuntimeError("chromium is missing and apt-get is not available to install it")
        env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env, timeout=900)
    return CHROMIUM


@dataclass(slots=True)
class Watch:
    """What a page did that a test must check: console errors, page errors, requests off this machine."""

    errors: list[str] = field(default_factory=list)
    external: list[str] = field(default_factory=list)

    def attach(self, page) -> None:
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        # a lambda, not the bound method: Playwright tags handlers with attributes, which slots forbid
        page.on("request", lambda request: self._request(request))

    def _request(self, request) -> None:
        url = urlparse(request.url)
        if url.scheme in ("data", "about", "blob"):
            return
        if url.scheme == "file" or url.hostname in LOCAL_HOSTS:
            return
        self.external.append(request.url)


@contextmanager
def chromium() -> Iterator:
    from playwright.sync_api import sync_playwright

    path = ensure_chromium()
    profile = tempfile.mkdtemp(prefix="fairgpu-chromium-")
    try:
        with sync_playwright() as pw:
            # a persistent context is how Playwright takes a user-data-dir: a fresh one per session
            context = pw.chromium.launch_persistent_context(
                profile, executable_path=path, args=ARGS, headless=True, viewport={"width": 1400, "height": 1000}
            )
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
