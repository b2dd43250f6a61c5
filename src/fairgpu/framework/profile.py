"""Profiles: named sets of plugins with their arguments, loaded from YAML and checked against the registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources as pkg_resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fairgpu.errors import ProfileError
from fairgpu.framework.interfaces import Admit, Filter, Permit, Preempt, QueueSort, Score
from fairgpu.spec import validation_message

_REGISTRY: dict[str, tuple[type, Callable[..., object]]] = {}


def register(point: type, name: str) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """Class decorator: make a plugin available to profiles under `name` at extension point `point`."""

    def wrap(factory: Callable[..., object]) -> Callable[..., object]:
        _REGISTRY[name] = (point, factory)
        return factory

    return wrap


def registered() -> dict[str, str]:
    """Plugin name → extension point name."""
    return {name: point.__name__ for name, (point, _) in sorted(_REGISTRY.items())}


class _PluginRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    weight: float = Field(default=1.0, gt=0)
    args: dict[str, Any] = Field(default_factory=dict)


class _ProfileDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    queueSort: _PluginRef | str
    admit: list[_PluginRef | str] = Field(default_factory=list)
    filter: list[_PluginRef | str] = Field(default_factory=list)
    score: list[_PluginRef | str] = Field(default_factory=list)
    permit: list[_PluginRef | str] = Field(default_factory=list)
    preempt: list[_PluginRef | str] = Field(default_factory=list)
    reserve: bool = False


@dataclass(slots=True)
class Profile:
    name: str
    queue_sort: QueueSort
    admit: list[Admit] = field(default_factory=list)
    filter: list[Filter] = field(default_factory=list)
    score: list[tuple[Score, float]] = field(default_factory=list)
    permit: list[Permit] = field(default_factory=list)
    preempt: list[Preempt] = field(default_factory=list)
    description: str = ""
    reserve: bool = False  # hold nodes for a workload that waited past its queue's starvation_after


def _build(ref: _PluginRef | str, point: type, where: str) -> object:
    ref = _PluginRef(name=ref) if isinstance(ref, str) else ref
    entry = _REGISTRY.get(ref.name)
    if entry is None:
        raise ProfileError(f"{where}: unknown plugin {ref.name!r} (known: {', '.join(sorted(_REGISTRY))})")
    if entry[0] is not point:
        raise ProfileError(f"{where}: {ref.name} is a {entry[0].__name__} plugin, not {point.__name__}")
    try:
        return entry[1](**ref.args)
    except (TypeError, ValueError) as err:
        raise ProfileError(f"{where}: {ref.name} args: {err}") from err


def profile_from_dict(doc: dict[str, Any]) -> Profile:
    import fairgpu.plugins  # noqa: F401 - registers the built-in plugins

    try:
        parsed = _ProfileDoc.model_validate(doc)
    except ValidationError as err:
        raise ProfileError(f"profile {validation_message(err)}") from err

    def refs(items: list[_PluginRef | str], point: type, key: str) -> list:
        return [_build(ref, point, f"{key}[{i}]") for i, ref in enumerate(items)]

    scores = [
        (_build(ref, Score, f"score[{i}]"), ref.weight if isinstance(ref, _PluginRef) else 1.0)
        for i, ref in enumerate(parsed.score)
    ]
    return Profile(
        name=parsed.name,
        description=parsed.description,
        queue_sort=_build(parsed.queueSort, QueueSort, "queueSort"),  # type: ignore[arg-type]
        admit=refs(parsed.admit, Admit, "admit"),
        filter=refs(parsed.filter, Filter, "filter"),
        score=scores,
        permit=refs(parsed.permit, Permit, "permit"),
        preempt=refs(parsed.preempt, Preempt, "preempt"),
        reserve=parsed.reserve,
    )


def builtin_profiles() -> list[str]:
    folder = pkg_resources.files("fairgpu") / "profiles"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a profile YAML file by path."""
    path = Path(name_or_path)
    if name_or_path in builtin_profiles():
        text = (pkg_resources.files("fairgpu") / "profiles" / f"{name_or_path}.yaml").read_text()
    elif path.suffix in (".yaml", ".yml") and path.is_file():
        text = path.read_text()
    else:
        raise ProfileError(f"profile {name_or_path!r}: not a built-in ({', '.join(builtin_profiles())}) or file")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ProfileError(f"profile {name_or_path}: not valid YAML: {err}") from err
    if not isinstance(doc, dict):
        raise ProfileError(f"profile {name_or_path}: expected a mapping")
    return profile_from_dict(doc)
