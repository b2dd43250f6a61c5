"""Object validation the apiserver does and a scheduler's writes can trip (design/fake-apiserver.md §7b):
names (DNS-1123), label keys and values, annotation keys, resource quantities, and custom resources against
their CRD's structural schema (types, enums, required fields; unknown fields pruned). Failures are 422
Invalid with `details.causes`, worded as the apiserver words them."""

from __future__ import annotations

import re

from .errors import ApiError

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_NAME_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for "
    "validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
KEY_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
# Kinds whose names are DNS-1123 labels rather than subdomains.
LABEL_NAMED = {"Namespace", "Service"}


class Invalid:
    """Collects field errors; `raise_for` turns them into the apiserver's 422."""

    def __init__(self) -> None:
        self.causes: list[dict] = []

    def add(self, field: str, message: str, reason: str = "FieldValueInvalid") -> None:
        self.causes.append({"reason": reason, "message": message, "field": field})

    def raise_for(self, kind: str, name: str, group: str = "") -> None:
        if not self.causes:
            return
        what = f"{kind}.{group}" if group else kind
        detail = ", ".join(f"{c['field']}: {c['message']}" for c in self.causes)
        if len(self.causes) > 1:
            detail = f"[{detail}]"
        raise ApiError(
            422,
            "Invalid",
            f'{what} "{name}" is invalid: {detail}',
            {"name": name, "group": group, "kind": kind, "causes": self.causes},
        )


def _qualified_key(key: str, field: str, errs: Invalid) -> None:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
        errs.add(field, f'Invalid value: "{key}": prefix part {SUBDOMAIN_MSG}')
    if not name:
        errs.add(field, f'Invalid value: "{key}": name part must be non-empty')
    elif len(name) > 63:
        errs.add(field, f'Invalid value: "{key}": name part must be no more than 63 characters')
    elif not QUALIFIED_NAME.match(name):
        errs.add(field, f'Invalid value: "{key}": {KEY_MSG}')


def metadata(kind: str, obj: dict, errs: Invalid) -> None:
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if name:
        pattern, message, limit = (
            (DNS1123_LABEL, LABEL_NAME_MSG, 63) if kind in LABEL_NAMED else (DNS1123_SUBDOMAIN, SUBDOMAIN_MSG, 253)
        )
        if len(name) > limit:
            errs.add("metadata.name", f'Invalid value: "{name}": must be no more than {limit} characters')
        elif not pattern.match(name):
            errs.add("metadata.name", f'Invalid value: "{name}": {message}')
    for key, value in (meta.get("labels") or {}).items():
        _qualified_key(key, "metadata.labels", errs)
        if not isinstance(value, str):
            errs.add(f"metadata.labels[{key}]", "Invalid value: label values must be strings")
        elif len(value) > 63:
            errs.add("metadata.labels", f'Invalid value: "{value}": must be no more than 63 characters')
        elif not LABEL_VALUE.match(value):
            errs.add("metadata.labels", f'Invalid value: "{value}": {VALUE_MSG}')
    annotations = meta.get("annotations") or {}
    for key in annotations:
        _qualified_key(key.lower(), "metadata.annotations", errs)
    if sum(len(k) + len(v) for k, v in annotations.items() if isinstance(v, str)) > 256 * 1024:
        errs.add("metadata.annotations", "Too long: must have at most 262144 bytes", "FieldValueTooLong")


def quantities(pod: dict) -> None:
    """Quantities are parsed when the body is decoded: a bad one is a 400, before any validation."""
    spec = pod.get("spec") or {}
    for field in ("initContainers", "containers"):
        for c in spec.get(field) or []:
            res = c.get("resources") or {}
            for part in ("limits", "requests"):
                for key, value in (res.get(part) or {}).items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        continue
                    if not isinstance(value, str) or not QUANTITY.match(value):
                        raise ApiError(
                            400,
                            "BadRequest",
                            f"quantities must match the regular expression "
                            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' ({field} {c.get('name')} {part}[{key}])",
                        )


# -- custom resources: structural schemas -------------------------------------------------------------------
_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
}
_GO_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}


def structural(value: object, schema: dict, path: str, errs: Invalid) -> object:
    """Validate `value` against a structural schema and return it with unknown fields pruned."""
    if value is None:
        if not schema.get("nullable"):
            errs.add(
                path, f'Invalid value: "null": {path} in body must be of type {schema.get("type", "object")}: "null"'
            )
        return value
    if schema.get("x-kubernetes-int-or-string"):
        if not (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))):
            got = _GO_TYPES.get(type(value), "unknown")
            errs.add(path, f'Invalid value: "{got}": {path} in body must be of type integer,string: "{got}"')
        return value
    kind = schema.get("type")
    if kind and not _TYPES[kind](value):
        got = _GO_TYPES.get(type(value), "unknown")
        errs.add(
            path, f'Invalid value: "{got}": {path} in body must be of type {kind}: "{got}"', "FieldValueTypeInvalid"
        )
        return value
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(f'"{v}"' for v in schema["enum"])
        errs.add(path, f'Unsupported value: "{value}": supported values: {allowed}', "FieldValueNotSupported")
    if isinstance(value, dict):
        for req in schema.get("required") or []:
            if req not in value:
                errs.add(f"{path}.{req}", "Required value", "FieldValueRequired")
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            props = schema.get("properties") or {}
            return {k: structural(v, props[k], f"{path}.{k}", errs) if k in props else v for k, v in value.items()}
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            if path == "" and key in ("apiVersion", "kind", "metadata"):
                out[key] = item
            elif props is not None and key in props:
                out[key] = structural(item, props[key], f"{path}.{key}".lstrip("."), errs)
            elif isinstance(extra, dict):
                out[key] = structural(item, extra, f"{path}.{key}".lstrip("."), errs)
            # anything else is pruned, as the apiserver silently drops unknown fields
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [structural(v, schema["items"], f"{path}[{i}]", errs) for i, v in enumerate(value)]
    return value
