"""Label and field selectors with the apiserver's grammar (design/fake-apiserver.md §4)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .errors import ApiError

_SET = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")


@dataclass(slots=True, frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key)
        match self.op:
            case "=":
                return has and value == self.values[0]
            case "!=":
                return not has or value != self.values[0]
            case "in":
                return has and value in self.values
            case "notin":
                return not has or value not in self.values
            case "exists":
                return has
            case _:
                return not has


def _split_terms(text: str) -> list[str]:
    """Split on commas outside parentheses: `a in (x,y),b` is two terms."""
    terms, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        terms.append(cur)
    return terms


def parse_labels(text: str | None) -> list[Requirement]:
    reqs = []
    for term in _split_terms(text or ""):
        if m := _SET.match(term):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
        elif m := _EQ.match(term):
            reqs.append(Requirement(m.group(1), "!=" if m.group(2) == "!=" else "=", (m.group(3),)))
        elif m := _EXISTS.match(term):
            reqs.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
    return reqs


_EXPRESSION_OPS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}


def label_selector(selector: dict | None) -> list[Requirement] | None:
    """A metav1.LabelSelector (matchLabels, matchExpressions) as requirements; None if it is invalid."""
    reqs = [Requirement(k, "=", (v,)) for k, v in ((selector or {}).get("matchLabels") or {}).items()]
    for e in (selector or {}).get("matchExpressions") or []:
        op = _EXPRESSION_OPS.get(e.get("operator", ""))
        values = tuple(e.get("values") or ())
        if op is None or not e.get("key") or bool(values) != (op in ("in", "notin")):
            return None
        reqs.append(Requirement(e["key"], op, values))
    return reqs


FieldGetter = Callable[[dict], str]


def _get(path: str) -> FieldGetter:
    keys = path.split(".")

    def get(obj: dict) -> str:
        cur: object = obj
        for k in keys:
            cur = cur.get(k) if isinstance(cur, dict) else None
        if isinstance(cur, bool):
            return "true" if cur else "false"
        return "" if cur is None else str(cur)

    return get


def field_getters(paths: tuple[str, ...]) -> dict[str, FieldGetter]:
    return {p: _get(p) for p in paths}


def parse_fields(text: str | None, supported: dict[str, FieldGetter], kind: str) -> list[tuple[str, str, str]]:
    reqs = []
    for term in (text or "").split(","):
        if not term.strip():
            continue
        m = re.match(r"^\s*([A-Za-z.]+)\s*(==|!=|=)\s*(.*?)\s*$", term)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector: {term!r}")
        if m.group(1) not in supported:
            raise ApiError(400, "BadRequest", f'"{m.group(1)}" is not a known field selector: only {kind} fields')
        reqs.append((m.group(1), "!=" if m.group(2) == "!=" else "=", m.group(3)))
    return reqs


@dataclass(slots=True)
class Selector:
    labels: list[Requirement]
    fields: list[tuple[str, str, str]]
    getters: dict[str, FieldGetter]

    def matches(self, obj: dict) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        if not all(r.matches(labels) for r in self.labels):
            return False
        for path, op, value in self.fields:
            have = self.getters[path](obj)
            if (have == value) != (op == "="):
                return False
        return True
