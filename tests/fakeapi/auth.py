"""Authentication and RBAC as the apiserver does them (design/fake-apiserver.md §7b).

Bearer tokens map to users registered through the test controls (a service account's user is
`system:serviceaccount:NS:NAME` in the groups `system:serviceaccounts`, `system:serviceaccounts:NS` and
`system:authenticated`). A request without a token is the cluster's administrator (`system:masters`), as a
kubeconfig with an admin client certificate would be: tests that do not care about authorisation keep
working, and tests that do use tokens. An unknown token is 401. Everyone authenticated may read discovery and
OpenAPI (the bootstrap `system:discovery` role). Everything else is allowed only by the Roles, ClusterRoles
and bindings stored in the fake (loaded from deploy/ by the tests), with the apiserver's 403 message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import ApiError

ADMIN_GROUPS = ("system:masters", "system:authenticated")
DISCOVERY = ("/api", "/apis", "/version", "/openapi", "/healthz", "/readyz", "/livez")


@dataclass(slots=True, frozen=True)
class User:
    username: str
    groups: tuple[str, ...] = ("system:authenticated",)
    uid: str = ""

    def info(self) -> dict:
        return {"username": self.username, "uid": self.uid, "groups": list(self.groups)}


ADMIN = User("system:admin", ADMIN_GROUPS)


def service_account(namespace: str, name: str) -> User:
    groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated")
    return User(f"system:serviceaccount:{namespace}:{name}", groups, f"sa-{namespace}-{name}")


@dataclass(slots=True, frozen=True)
class Attributes:
    """authorizer.Attributes: a resource request (resource set) or a non-resource one (path)."""

    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""

    def forbidden(self, user: str) -> ApiError:
        """responsewriters.forbiddenMessage wrapped in NewForbidden, word for word."""
        if not self.resource:
            return ApiError(403, "Forbidden", f'forbidden: User "{user}" cannot {self.verb} path "{self.path}"')
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        where = f'in the namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        why = f'User "{user}" cannot {self.verb} resource "{resource}" in API group "{self.group}" {where}'
        qualified = f"{self.resource}.{self.group}" if self.group else self.resource
        subject = f'{qualified} "{self.name}"' if self.name else qualified
        details = (
            {"name": self.name, "group": self.group, "kind": self.resource}
            if self.name
            else {
                "group": self.group,
                "kind": self.resource,
            }
        )
        return ApiError(403, "Forbidden", f"{subject} is forbidden: {why}", details)


@dataclass
class Authenticator:
    tokens: dict[str, User] = field(default_factory=dict)

    def user(self, authorization: str | None) -> User:
        if not authorization:
            return ADMIN
        scheme, _, token = authorization.partition(" ")
        user = self.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return user

    def review(self, token: str) -> User | None:
        return self.tokens.get(token)


def _subject_matches(subject: dict, user: User, binding_ns: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return name == user.username
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        return user.username == f"system:serviceaccount:{subject.get('namespace') or binding_ns}:{name}"
    return False


def _rule_allows(rule: dict, a: Attributes) -> bool:
    verbs = rule.get("verbs") or []
    if "*" not in verbs and a.verb not in verbs:
        return False
    if not a.resource:
        urls = rule.get("nonResourceURLs") or []
        return any(u == a.path or u == "*" or (u.endswith("*") and a.path.startswith(u[:-1])) for u in urls)
    groups = rule.get("apiGroups")
    if groups is None or ("*" not in groups and a.group not in groups):
        return False
    wanted = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    resources = rule.get("resources") or []
    if not any(
        r in ("*", wanted) or (a.subresource and r in (f"{a.resource}/*", f"*/{a.subresource}")) for r in resources
    ):
        return False
    names = rule.get("resourceNames") or []
    return not names or (bool(a.name) and a.name in names)


def allowed(store, user: User, a: Attributes) -> bool:
    """RBAC: the union of the rules every binding that names the user grants (no denies in RBAC)."""
    if "system:masters" in user.groups:
        return True
    if not a.resource and any(a.path == p or a.path.startswith(p + "/") for p in DISCOVERY):
        return "system:authenticated" in user.groups
    from .store import BY_KIND

    roles = BY_KIND["ClusterRole"], BY_KIND["Role"]
    everything = store.list_all
    for crb in everything(BY_KIND["ClusterRoleBinding"]):
        if any(_subject_matches(s, user, "") for s in crb.get("subjects") or []):
            role = store.objects.get(("rbac.authorization.k8s.io", "clusterroles", "", crb["roleRef"]["name"]))
            if role and any(_rule_allows(rule, a) for rule in role.get("rules") or []):
                return True
    if a.namespace:
        for rb in everything(BY_KIND["RoleBinding"]):
            ns = rb["metadata"]["namespace"]
            if ns != a.namespace or not any(_subject_matches(s, user, ns) for s in rb.get("subjects") or []):
                continue
            ref = rb["roleRef"]
            res = roles[0] if ref["kind"] == "ClusterRole" else roles[1]
            role = store.objects.get((res.group, res.plural, "" if ref["kind"] == "ClusterRole" else ns, ref["name"]))
            if role and any(_rule_allows(rule, a) for rule in role.get("rules") or []):
                return True
    return False
