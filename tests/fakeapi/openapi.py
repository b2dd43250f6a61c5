"""OpenAPI v3 discovery, enough for kubectl to validate without `--validate=false`: the root lists each
group-version, and each group-version's document has a PATCH operation per kind that declares the
`fieldValidation` query parameter, so kubectl asks the server to validate (`?fieldValidation=Strict`) and
the fake then refuses unknown fields as the apiserver does (built-in kinds through kubernetes-validate's
schemas, custom resources through their CRD's schema)."""

from __future__ import annotations

import hashlib

import kubernetes_validate
from kubernetes_validate.utils import ValidationError

from .errors import ApiError
from .store import RESOURCES, Resource

FIELD_VALIDATION = {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def root() -> dict:
    paths = {}
    for group, version in sorted({(r.group, r.version) for r in RESOURCES}):
        path = _gv_path(group, version)
        digest = hashlib.sha256(path.encode()).hexdigest()[:16].upper()
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}


def group_version(path: str) -> dict | None:
    parts = path.split("/")
    group, version = ("", parts[1]) if parts[0] == "api" and len(parts) == 2 else (parts[1], parts[2])
    served = [r for r in RESOURCES if (r.group, r.version) == (group, version)]
    if not served or path != _gv_path(group, version):
        return None
    paths = {}
    for r in served:
        base = f"/{path}/namespaces/{{namespace}}/{r.plural}" if r.namespaced else f"/{path}/{r.plural}"
        gvk = {"group": r.group, "version": r.version, "kind": r.kind}
        op = {"parameters": [FIELD_VALIDATION], "x-kubernetes-group-version-kind": gvk, "responses": {}}
        paths[f"{base}/{{name}}"] = {"patch": op, "put": op, "get": {"x-kubernetes-group-version-kind": gvk}}
        paths[base] = {"post": op}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes (fake)", "version": "v1.32.0"}, "paths": paths}


def unknown_fields(res: Resource, obj: dict, schema: dict | None) -> None:
    """Strict field validation: 400 naming the first field the kind does not declare."""
    if res.custom:
        if schema is not None:
            _undeclared(obj, schema, "")
        return
    if res.group in ("fairgpu.io",) or res.kind in ("TokenReview", "SubjectAccessReview"):
        return
    try:
        kubernetes_validate.validate({**obj, "apiVersion": res.api_version, "kind": res.kind}, "1.32", strict=True)
    except ValidationError as err:
        if err.validator != "additionalProperties":
            return  # other schema problems are the handlers' to report, with their codes
        extra = str(err.message).split("'")[1] if "'" in str(err.message) else "?"
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.path).lstrip(".")
        field = f"{where}.{extra}" if where else extra
        raise ApiError(400, "BadRequest", f'strict decoding error: unknown field "{field}"') from err
    except (kubernetes_validate.utils.SchemaNotFoundError, kubernetes_validate.utils.InvalidSchemaError):
        return


def _undeclared(value: object, schema: dict, path: str) -> None:
    if schema.get("x-kubernetes-preserve-unknown-fields") or not isinstance(value, dict):
        if isinstance(value, list) and isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                _undeclared(item, schema["items"], f"{path}[{i}]")
        return
    props = schema.get("properties")
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        if path == "" and key in ("apiVersion", "kind", "metadata"):
            continue
        if props is not None and key in props:
            _undeclared(item, props[key], f"{path}.{key}")
        elif isinstance(extra, dict):
            _undeclared(item, extra, f"{path}.{key}")
        elif props is not None or extra is False:
            raise ApiError(400, "BadRequest", f"{path}.{key}: field not declared in schema")
