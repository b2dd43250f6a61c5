"""The built-in profiles, assembled from the built-in plugins: the one place above both the framework
(which parses profiles) and the plugins (which register nothing by themselves)."""

from __future__ import annotations

from importlib import resources as pkg_resources
from pathlib import Path
from typing import Any

from fairgpu.errors import ProfileError
from fairgpu.framework.profile import Profile, parse_profile, points_of
from fairgpu.plugins.registry import IN_TREE
from fairgpu.spec import load_yaml


def registered() -> dict[str, str]:
    """Built-in plugin name → extension point name."""
    return points_of(IN_TREE)


def profile_from_dict(doc: dict[str, Any]) -> Profile:
    """A profile over the built-in plugins. Raises ProfileError naming the key."""
    return parse_profile(doc, IN_TREE)


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
    doc = load_yaml(text, f"profile {name_or_path}")  # duplicate keys refused, errors name the line
    if not isinstance(doc, dict):
        raise ProfileError(f"profile {name_or_path}: expected a mapping")
    return profile_from_dict(doc)
