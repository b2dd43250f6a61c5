"""Patch media types (design/fake-apiserver.md §7.6): merge, JSON patch, and strategic merge for maps and
the lists this scheduler touches (merge keys below); anything else is rejected loudly."""

from __future__ import annotations

import copy
import json

from .errors import ApiError

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"

# Lists with a patch-merge-key in the Kubernetes types the fake serves; other lists are atomic (replaced).
_MERGE_KEYS = {"conditions": "type", "containers": "name", "initContainers": "name", "tolerations": None}


def merge_patch(target: object, patch: object) -> object:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def strategic_patch(target: object, patch: object) -> object:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):
            raise ApiError(400, "BadRequest", f"fake apiserver: strategic-merge directive {k} is not supported")
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and _MERGE_KEYS.get(k):
            out[k] = _merge_list(out.get(k) or [], v, _MERGE_KEYS[k])
        else:
            out[k] = strategic_patch(out.get(k), v)
    return out


def _merge_list(current: list, patch: list, key: str) -> list:
    merged = [copy.deepcopy(x) for x in current]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise ApiError(400, "BadRequest", f"fake apiserver: list items need merge key {key!r}")
        for i, have in enumerate(merged):
            if have.get(key) == item[key]:
                merged[i] = strategic_patch(have, item)
                break
        else:
            merged.append(copy.deepcopy(item))
    return merged


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(400, "BadRequest", f"json patch: path {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: object, parts: list[str], path: str) -> tuple[object, str]:
    cur = doc
    for p in parts[:-1]:
        if isinstance(cur, dict) and p in cur:
            cur = cur[p]
        elif isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
            cur = cur[int(p)]
        else:
            raise ApiError(422, "Invalid", f"json patch: path {path!r} does not exist")
    return cur, parts[-1]


def json_patch(doc: object, ops: object) -> object:
    """RFC 6902: add, remove, replace, test, move, copy."""
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "json patch: body must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, "BadRequest", f"json patch: malformed operation {op!r}")
        kind, path = op["op"], op["path"]
        if kind in ("move", "copy"):
            value = _read(doc, _pointer(op.get("from", "")), op.get("from", ""))
            if kind == "move":
                doc = _remove(doc, _pointer(op["from"]), op["from"])
            doc = _add(doc, _pointer(path), path, copy.deepcopy(value))
        elif kind == "add":
            doc = _add(doc, _pointer(path), path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, _pointer(path), path)
        elif kind == "replace":
            doc = _remove(doc, _pointer(path), path)
            doc = _add(doc, _pointer(path), path, copy.deepcopy(op.get("value")))
        elif kind == "test":
            if _read(doc, _pointer(path), path) != op.get("value"):
                raise ApiError(422, "Invalid", f"json patch: test failed at {path!r}")
        else:
            raise ApiError(400, "BadRequest", f"json patch: unknown op {kind!r}")
    return doc


def _read(doc: object, parts: list[str], path: str) -> object:
    if not parts:
        return doc
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise ApiError(422, "Invalid", f"json patch: path {path!r} does not exist")


def _add(doc: object, parts: list[str], path: str, value: object) -> object:
    if not parts:
        return value
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list) and (last == "-" or (last.isdigit() and int(last) <= len(parent))):
        parent.insert(len(parent) if last == "-" else int(last), value)
    else:
        raise ApiError(422, "Invalid", f"json patch: cannot add at {path!r}")
    return doc


def _remove(doc: object, parts: list[str], path: str) -> object:
    _read(doc, parts, path)
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict):
        del parent[last]
    else:
        del parent[int(last)]  # type: ignore[index]
    return doc


def apply(content_type: str, target: dict, raw: bytes) -> dict:
    media = content_type.split(";")[0].strip()
    if media not in (MERGE, JSON_PATCH, STRATEGIC):
        raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - {media}")
    try:
        body = json.loads(raw)
    except ValueError as err:
        raise ApiError(400, "BadRequest", f"error decoding patch: {err}") from err
    if media == MERGE:
        out = merge_patch(target, body)
    elif media == STRATEGIC:
        out = strategic_patch(target, body)
    else:
        out = json_patch(target, body)
    if not isinstance(out, dict):
        raise ApiError(422, "Invalid", "patched object is not an object")
    return out
