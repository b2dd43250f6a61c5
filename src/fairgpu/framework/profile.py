"""Profiles: named sets of plugins with their arguments, parsed from YAML and checked against a registry.

The framework never imports the plugins: a registry (name → extension point and factory) is handed in by
whoever assembles profiles (`fairgpu.catalog` for the built-in plugins)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fairgpu.errors import ProfileError
from fairgpu.framework.interfaces import Admit, Filter, Permit, Preempt, Profile, QueueSort, Score
from fairgpu.spec import validation_message

__all__ = ["POINTS", "Named", "PluginEntry", "Profile", "Registry", "parse_profile", "points_of"]

POINTS: tuple[type, ...] = (QueueSort, Admit, Filter, Score, Permit, Preempt)


class Named(Protocol):
    """A plugin class: its NAME is how profiles and the registry refer to it."""

    NAME: ClassVar[str]


@dataclass(slots=True, frozen=True)
class PluginEntry:
    """A plugin a profile may name: the extension point it implements and how to build it from its args."""

    point: type
    factory: Callable[..., object]


Registry = Mapping[str, PluginEntry]


def points_of(registry: Registry) -> dict[str, str]:
    """Plugin name → extension point name."""
    return {name: entry.point.__name__ for name, entry in sorted(registry.items())}


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
    gang: bool = False


def _build(ref: _PluginRef | str, point: type, where: str, registry: Registry) -> Any:
    """The plugin `ref` names, checked to implement `point` (a Protocol: the check is at run time)."""
    ref = _PluginRef(name=ref) if isinstance(ref, str) else ref
    entry = registry.get(ref.name)
    if entry is None:
        raise ProfileError(f"{where}: unknown plugin {ref.name!r} (known: {', '.join(sorted(registry))})")
    if entry.point is not point:
        raise ProfileError(f"{where}: {ref.name} is a {entry.point.__name__} plugin, not {point.__name__}")
    try:
        plugin = entry.factory(**ref.args)
    except (TypeError, ValueError) as err:
        raise ProfileError(f"{where}: {ref.name} args: {err}") from err
    if not isinstance(plugin, point):  # a registered plugin that drifted from its extension point's contract
        raise ProfileError(f"{where}: plugin {ref.name!r} does not implement {point.__name__}")
    return plugin


def parse_profile(doc: dict[str, Any], registry: Registry) -> Profile:
    """A profile from its YAML mapping, each plugin built from `registry`. Raises ProfileError naming the key."""
    try:
        parsed = _ProfileDoc.model_validate(doc)
    except ValidationError as err:
        raise ProfileError(f"profile {validation_message(err)}") from err

    def refs(items: list[_PluginRef | str], point: type, key: str) -> list[Any]:
        return [_build(ref, point, f"{key}[{i}]", registry) for i, ref in enumerate(items)]

    if parsed.gang and not parsed.permit:
        raise ProfileError("profile gang: true needs a Permit plugin (e.g. Gang) to decide on partial placements")
    if parsed.permit and not parsed.gang:
        raise ProfileError("profile permit: Permit plugins judge a gang's partial placement; set gang: true")
    scores = [
        (_build(ref, Score, f"score[{i}]", registry), ref.weight if isinstance(ref, _PluginRef) else 1.0)
        for i, ref in enumerate(parsed.score)
    ]
    return Profile(
        name=parsed.name,
        description=parsed.description,
        queue_sort=_build(parsed.queueSort, QueueSort, "queueSort", registry),
        admit=refs(parsed.admit, Admit, "admit"),
        filter=refs(parsed.filter, Filter, "filter"),
        score=scores,
        permit=refs(parsed.permit, Permit, "permit"),
        preempt=refs(parsed.preempt, Preempt, "preempt"),
        reserve=parsed.reserve,
        gang=parsed.gang,
    )
