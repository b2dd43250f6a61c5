"""Who submitted a pod, as fairgpu records it, and who may write what fairgpu reads.

The user is stamped at CREATE from the request's authenticated user: a label the engine groups users by and
the full name in an annotation. The label is a readable prefix plus a hash of the whole name, so two names
never share a label (`a@b.com` and `a_b.com` both read `a_b.com` once escaped) and a long name is never cut
into someone else's. Pods made by a controller (a Job's pods, a Deployment's ReplicaSet) inherit the stamp
their owner's pod template got when the user created it, as YuniKorn's admission controller does.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fairgpu.errors import InputError

log = logging.getLogger(__name__)

USER_LABEL = "fairgpu.io/user"  # translate.USER_LABEL: what the engine reads
USER_ANNOTATION = "fairgpu.io/user-name"  # the full, unescaped name
GANG_ADMITTED = "fairgpu.io/gang-admitted"  # the controller's mark on a gang that started binding
QUEUE_LABEL = "fairgpu.io/queue"
# On a pod a controller made from a template nobody stamped (its workload was created while the webhook was
# down): the pod's owner, `<apiVersion>/<kind>/<name>`. Such a pod is charged to no one and waits (see
# Controller._unattributed) rather than run in the controller's name.
UNATTRIBUTED = "fairgpu.io/unattributed"
# HAMi keys a user may set: scheduling hints its own webhook documents. Every other hami.io/ key records an
# allocation (devices, node, bind phase) that only the scheduler that placed the pod may write.
HAMI_USER_KEYS = frozenset({"hami.io/gpu-scheduler-policy", "hami.io/node-scheduler-policy"})
FAIRGPU_SA = "system:serviceaccount:fairgpu-system:fairgpu"
# The identities that create pods (and ReplicaSets, Jobs) from a template some user wrote: the objects they
# create keep the stamp the template carries. Their pods are still checked for everything else. What
# `fairgpu run` uses without the ConfigMap (deploy/trusted-identities.yaml lists the same, under
# CONTROLLER_KEY keys, and the API server's policy reads it there).
DEFAULT_CONTROLLERS = (
    "system:kube-controller-manager",
    *(
        f"system:serviceaccount:kube-system:{c}"
        for c in (
            "job-controller",
            "cronjob-controller",
            "replicaset-controller",
            "deployment-controller",
            "statefulset-controller",
            "daemon-set-controller",
        )
    ),
)
_HASH = 10  # hex digits of sha256: 40 bits, collisions need ~10^6 names
_PREFIX = 63 - _HASH - 1


def user_label(username: str) -> str:
    """A valid label value that names this user and no other: `system:serviceaccount:ml:runner` →
    `system.serviceaccount.ml.runner-<hash>`, `a@b.com` → `a_b.com-<hash>`."""
    digest = hashlib.sha256(username.encode()).hexdigest()[:_HASH]
    readable = re.sub(r"[^A-Za-z0-9_.-]", lambda m: "." if m.group() == ":" else "_", username)[:_PREFIX]
    readable = readable.strip("_.-")
    return f"{readable}-{digest}" if readable else digest


def is_control_key(key: str) -> bool:
    """A label or annotation only fairgpu (or a trusted identity) may set or change on a pod."""
    if key.startswith("hami.io/"):
        return key not in HAMI_USER_KEYS
    return key in (USER_LABEL, USER_ANNOTATION, GANG_ADMITTED, UNATTRIBUTED)


@dataclass(slots=True, frozen=True)
class Trust:
    """`fairgpu` and `trusted` may write anything fairgpu reads (an operator's break-glass identity, say);
    `controllers` create objects from templates and keep the user stamped on them."""

    fairgpu: str = FAIRGPU_SA
    trusted: frozenset[str] = frozenset()
    controllers: frozenset[str] = frozenset(DEFAULT_CONTROLLERS)

    @classmethod
    def of(cls, fairgpu: str, trusted: Iterable[str] = (), controllers: Iterable[str] = DEFAULT_CONTROLLERS) -> Trust:
        return cls(fairgpu, frozenset(trusted), frozenset(controllers))

    def full(self, user: str) -> bool:
        return user == self.fairgpu or user in self.trusted

    def keeps_stamp(self, user: str) -> bool:
        return self.full(user) or user in self.controllers

    def attributes(self, user: str) -> bool:
        """Objects this user creates are charged to it when they carry no stamp: everyone but a controller,
        which only copies templates others wrote."""
        return self.full(user) or user not in self.controllers


TRUSTED_CONFIGMAP = ("fairgpu-system", "fairgpu-trusted-identities")  # deploy/trusted-identities.yaml
# Its keys that name workload controllers (Trust.controllers) rather than trusted identities: both policies
# that read it tell them apart by this prefix (deploy/admission-policies.yaml).
CONTROLLER_KEY = "controller."


def configmap_ref(value: str) -> tuple[str, str]:
    """NAMESPACE/NAME of a ConfigMap; InputError naming the option otherwise."""
    ns, sep, name = value.partition("/")
    if not (sep and ns and name) or "/" in name:
        raise InputError(f"--trusted-identities-configmap: expected NAMESPACE/NAME, got {value!r}")
    return ns, name


def read_trusted(directory: str) -> tuple[list[str], list[str]]:
    """The trusted identities and the workload controllers (files named CONTROLLER_KEY...) in a mounted
    ConfigMap (deploy/trusted-identities.yaml): one per file; the volume's own `..data` entries are skipped.
    The API server's policies read the same ConfigMap. InputError naming the file when one cannot be read or
    holds more than one line (the policies compare whole values, so a second name there would be trusted by
    neither)."""
    base = Path(directory)
    if not base.is_dir():
        raise InputError(f"--trusted-identities: {directory} is not a directory (mount the ConfigMap there)")
    names: tuple[list[str], list[str]] = ([], [])
    for f in sorted(base.iterdir()):
        if f.name.startswith(".") or not f.is_file():
            continue
        try:
            name = f.read_text().strip()
        except (OSError, UnicodeDecodeError) as err:
            raise InputError(f"--trusted-identities: {f}: cannot be read ({err})") from err
        if "\n" in name:
            raise InputError(f"--trusted-identities: {f}: one identity per file, found {len(name.splitlines())} lines")
        if name:
            names[f.name.startswith(CONTROLLER_KEY)].append(name)
    return names


class TrustedIdentities:
    """Whom the webhook trusts, following the mounted ConfigMap: read again when its files change (the kubelet
    swaps the volume's `..data` symlink), so an edit takes effect without a restart. A list that cannot be
    read keeps the last good one (an edit gone wrong never widens trust) and is logged, naming the problem;
    `on_news(problem, message)` hears of each new problem (True) and of each change of whom it trusts (False),
    from the thread that calls `check()` (app.report_trust makes them Events on the ConfigMap).
    Call it for the Trust in force; `check()` from one thread at a time."""

    def __init__(self, directory: str, base: Trust) -> None:
        # base.trusted, base.controllers: the --trusted-identity and --pod-controller users, always kept
        self.directory, self.base = directory, base
        self.problem: str | None = None
        self.on_news: Callable[[bool, str], None] | None = None
        self._seen = self._stamp()
        self._trust = self._with(*read_trusted(directory))  # at start a broken list is the caller's error

    def __call__(self) -> Trust:
        return self._trust

    def _with(self, trusted: list[str], controllers: list[str]) -> Trust:
        base = self.base
        return Trust(base.fairgpu, base.trusted | frozenset(trusted), base.controllers | frozenset(controllers))

    def _stamp(self) -> tuple:
        try:  # every entry, symlinks followed: ..data's target changes at each kubelet update
            return tuple(
                (f.name, f.stat().st_ino, f.stat().st_mtime_ns) for f in sorted(Path(self.directory).iterdir())
            )
        except OSError:
            return ()

    def check(self) -> bool:
        """Read the list again if its files changed; True when a new list is in force."""
        stamp = self._stamp()
        if stamp == self._seen:
            return False
        self._seen = stamp
        try:
            trust = self._with(*read_trusted(self.directory))
        except InputError as err:
            known, self.problem = self.problem, str(err)
            if str(err) != known:
                message = f"trusted identities not reloaded, the last good list stays: {err}"
                log.error("%s", message)
                self._tell(True, message)
            return False
        self.problem = None
        if trust == self._trust:
            return False
        self._trust = trust
        message = (
            f"trusted identities reloaded from {self.directory}: {', '.join(sorted(trust.trusted)) or 'none'};"
            f" workload controllers: {', '.join(sorted(trust.controllers)) or 'none'}"
        )
        log.info("%s", message)
        self._tell(False, message)
        return True

    def _tell(self, problem: bool, message: str) -> None:
        """Best effort: a listener that fails must not stop the caller's reloads (the webhook's reloader also
        renews its serving certificate)."""
        if self.on_news is not None:
            try:
                self.on_news(problem, message)
            except Exception:
                log.exception("trusted identities: telling of %r failed", message)


def owner_of(meta: dict) -> str:
    """`<apiVersion>/<kind>/<name>` of the object's controlling owner; "" when it names none."""
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return f"{ref.get('apiVersion', '')}/{ref.get('kind', '')}/{ref.get('name', '')}"
    return ""


# -- pod templates of the workload kinds that make pods ---------------------------------------------------
TEMPLATE_KINDS = {
    ("batch", "Job"),
    ("batch", "CronJob"),
    ("apps", "Deployment"),
    ("apps", "ReplicaSet"),
    ("apps", "StatefulSet"),
    ("apps", "DaemonSet"),
    ("kubeflow.org", "PyTorchJob"),
    ("kubeflow.org", "TFJob"),
    ("kubeflow.org", "MPIJob"),
    ("kubeflow.org", "XGBoostJob"),
    ("kubeflow.org", "PaddleJob"),
    ("kubeflow.org", "JAXJob"),
    ("jobset.x-k8s.io", "JobSet"),
    ("ray.io", "RayJob"),
    ("ray.io", "RayCluster"),
}


def pod_templates(group: str, kind: str, obj: dict) -> Iterator[tuple[str, ...]]:
    """Paths (JSON pointer segments) of every pod template in a workload of one of TEMPLATE_KINDS."""
    spec = obj.get("spec") or {}
    if kind == "CronJob":
        yield ("spec", "jobTemplate", "spec", "template")
    elif group in ("batch", "apps"):
        yield ("spec", "template")
    elif group == "kubeflow.org":  # spec.<kind>ReplicaSpecs.<role>.template (Master, Worker, Launcher, ...)
        for field, roles in spec.items():
            if field.endswith("ReplicaSpecs") and isinstance(roles, dict):
                yield from (("spec", field, role, "template") for role in roles)
    elif kind == "JobSet":
        for i, _ in enumerate(spec.get("replicatedJobs") or []):
            yield ("spec", "replicatedJobs", str(i), "template", "spec", "template")
    elif group == "ray.io":
        base = ("spec", "rayClusterSpec") if kind == "RayJob" else ("spec",)
        cluster = spec.get("rayClusterSpec") or {} if kind == "RayJob" else spec
        if "headGroupSpec" in cluster:
            yield (*base, "headGroupSpec", "template")
        for i, _ in enumerate(cluster.get("workerGroupSpecs") or []):
            yield (*base, "workerGroupSpecs", str(i), "template")


def at(obj: object, path: tuple[str, ...]) -> object:
    for part in path:
        if isinstance(obj, dict):
            obj = obj.get(part)
        elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return None
    return obj
