"""Which kubeconfig a command will use, checked before anything connects: a missing file or one without
a current context is one line naming the file, not kubernetes-asyncio's "Expected key current-context"."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from fairgpu.errors import InputError

IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"


def resolve_kubeconfig(path: str | None) -> str | None:
    """The kubeconfig to use: the one given, else $KUBECONFIG's first file, else ~/.kube/config if it
    exists; None means the pod's in-cluster service account."""
    if path:
        return path
    env = os.environ.get("KUBECONFIG", "")
    if env:
        return env.split(os.pathsep)[0]
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


def check_kubeconfig(path: str | None, option: str = "--kubeconfig") -> None:
    """Raise InputError unless `path` is a kubeconfig with a usable current context (or, with no path,
    this process runs in a pod)."""
    if path is None:
        if not os.environ.get(IN_CLUSTER_ENV):
            raise InputError(f"{option}: not given, and not running in a pod ({IN_CLUSTER_ENV} is not set)")
        return
    file = Path(path).expanduser()
    if not file.is_file():
        raise InputError(f"{option}: {path}: no such file")
    try:
        doc = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        raise InputError(f"{option}: {path}: not a kubeconfig (not readable YAML)") from None
    if not isinstance(doc, dict):
        raise InputError(f"{option}: {path}: not a kubeconfig (expected a mapping)")
    current = doc.get("current-context")
    if not current:
        raise InputError(f"{option}: {path}: no current-context set (kubectl config use-context NAME)")
    names = {c.get("name") for c in doc.get("contexts") or [] if isinstance(c, dict)}
    if current not in names:
        raise InputError(f"{option}: {path}: current-context {current!r} is not among its contexts")
