"""The resource types the fake serves and the discovery documents that describe them.

A `ResourceType` is one (group, version, plural): kind, scope, short names, verbs, whether it
has a `status` subresource, and for custom resources the CRD's OpenAPI schema. Built-in types
(core `v1` namespaces, secrets, services, serviceaccounts and persistentvolumeclaims, `apps/v1`
deployments, `rbac.authorization.k8s.io/v1` roles and rolebindings,
`apiextensions.k8s.io/v1` customresourcedefinitions) are fixed; the workload kinds among them
carry the lightkube model they are decoded against (`builtin_kinds.py`); custom resources appear when a CRD is stored and disappear with it, as on a real
cluster, so `kubectl apply -f deploy/crds/` against an empty fake makes `calibantasks` appear.

Discovery is the legacy (unaggregated) form: `/api`, `/api/v1`, `/apis`, `/apis/<g>`,
`/apis/<g>/<v>`. Clients that ask for aggregated discovery (`apidiscovery.k8s.io/v2`) in their
Accept header fall back to it when the response is plain `application/json`, which is what the
apiserver's content negotiation allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightkube.models import apps_v1, core_v1, rbac_v1

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    status_subresource: bool = False
    schema: dict[str, Any] | None = None  # openAPIV3Schema of a custom resource
    custom: bool = False  # served from a CRD (unstructured: list items keep kind/apiVersion)
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    model: Any = None  # a built-in workload kind's lightkube model (its Go type's fields)
    generation: bool = False  # the server keeps metadata.generation (built-ins that have it)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        """Storage key: a group and plural (one stored version per resource here)."""
        return (self.group, self.plural)

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def group_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def api_resource(self) -> list[dict[str, Any]]:
        """This type's entries in an APIResourceList (the resource, then its subresource)."""
        main: dict[str, Any] = {
            "name": self.plural,
            "singularName": self.singular or self.kind.lower(),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(ALL_VERBS),
        }
        if self.short_names:
            main["shortNames"] = list(self.short_names)
        if self.categories:
            main["categories"] = list(self.categories)
        main["storageVersionHash"] = _hash(self)
        out = [main]
        if self.status_subresource:
            out.append(
                {
                    "name": f"{self.plural}/status",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        return out


def _hash(rt: ResourceType) -> str:
    import base64
    import hashlib

    digest = hashlib.sha256(f"{rt.group}/{rt.version}/{rt.kind}".encode()).digest()
    return base64.b64encode(digest[:8]).decode()


NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", False, "namespace", ["ns"])
SECRETS = ResourceType("", "v1", "secrets", "Secret", True, "secret")
CRDS = ResourceType(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    "CustomResourceDefinition",
    False,
    "customresourcedefinition",
    ["crd", "crds"],
    categories=["api-extensions"],
    status_subresource=True,
)
SERVICES = ResourceType(
    "", "v1", "services", "Service", True, "service", ["svc"], categories=["all"],
    status_subresource=True, model=core_v1.Service,
)
SERVICE_ACCOUNTS = ResourceType(
    "", "v1", "serviceaccounts", "ServiceAccount", True, "serviceaccount", ["sa"],
    model=core_v1.ServiceAccount,
)
PVCS = ResourceType(
    "", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, "persistentvolumeclaim",
    ["pvc"], status_subresource=True, model=core_v1.PersistentVolumeClaim,
)
DEPLOYMENTS = ResourceType(
    "apps", "v1", "deployments", "Deployment", True, "deployment", ["deploy"],
    categories=["all"], status_subresource=True, model=apps_v1.Deployment, generation=True,
)
ROLES = ResourceType(
    "rbac.authorization.k8s.io", "v1", "roles", "Role", True, "role", model=rbac_v1.Role
)
ROLE_BINDINGS = ResourceType(
    "rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, "rolebinding",
    model=rbac_v1.RoleBinding,
)
BUILTIN = [
    NAMESPACES, SECRETS, SERVICES, SERVICE_ACCOUNTS, PVCS, DEPLOYMENTS, ROLES, ROLE_BINDINGS, CRDS,
]


def from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """The served versions of a stored CRD, each as a ResourceType."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    out = []
    for v in spec.get("versions") or []:
        if not v.get("served", True):
            continue
        sub = v.get("subresources") or {}
        out.append(
            ResourceType(
                group=spec.get("group", ""),
                version=v.get("name", ""),
                plural=names.get("plural", ""),
                kind=names.get("kind", ""),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                singular=names.get("singular") or names.get("kind", "").lower(),
                short_names=list(names.get("shortNames") or []),
                categories=list(names.get("categories") or []),
                status_subresource="status" in sub,
                schema=(v.get("schema") or {}).get("openAPIV3Schema"),
                custom=True,
                printer_columns=list(v.get("additionalPrinterColumns") or []),
            )
        )
    return out


class Registry:
    """The types served now: built-ins plus what the stored CRDs declare."""

    def __init__(self) -> None:
        self._builtin = list(BUILTIN)
        self._custom: dict[str, list[ResourceType]] = {}  # by CRD name

    def set_crd(self, name: str, types: list[ResourceType]) -> None:
        self._custom[name] = types

    def drop_crd(self, name: str) -> list[ResourceType]:
        return self._custom.pop(name, [])

    def all(self) -> list[ResourceType]:
        out = list(self._builtin)
        for name in sorted(self._custom):
            out.extend(self._custom[name])
        return out

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        for rt in self.all():
            if (rt.group, rt.version, rt.plural) == (group, version, plural):
                return rt
        return None

    def versions(self, group: str) -> list[str]:
        seen: list[str] = []
        for rt in self.all():
            if rt.group == group and rt.version not in seen:
                seen.append(rt.version)
        return seen

    def groups(self) -> list[str]:
        seen: list[str] = []
        for rt in self.all():
            if rt.group and rt.group not in seen:
                seen.append(rt.group)
        return seen

    # discovery documents -------------------------------------------------------------------

    def core_versions(self, server_address: str) -> dict[str, Any]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
            ],
        }

    def group_doc(self, group: str) -> dict[str, Any]:
        versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in self.versions(group)]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": versions,
            "preferredVersion": versions[0],
        }

    def group_list(self) -> dict[str, Any]:
        groups = []
        for g in self.groups():
            doc = self.group_doc(g)
            del doc["kind"], doc["apiVersion"]
            groups.append(doc)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        types = [rt for rt in self.all() if rt.group == group and rt.version == version]
        if not types:
            return None
        resources: list[dict[str, Any]] = []
        for rt in sorted(types, key=lambda t: t.plural):
            resources.extend(rt.api_resource())
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }
