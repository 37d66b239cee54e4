"""What kube-apiserver does to the built-in workload kinds the deploy manifests use, on every
write: decode against the Go types (`typed.py`), default, reset or carry server-owned parts,
validate.

Kinds: apps/v1 Deployment, v1 Service, ServiceAccount, PersistentVolumeClaim,
rbac.authorization.k8s.io/v1 Role and RoleBinding (v1 Namespace and Secret are in `verbs.py`).

Defaults are the apiserver's `SetDefaults_*` for the fields these kinds carry: a Deployment's
replicas 1, RollingUpdate 25%/25%, revisionHistoryLimit 10, progressDeadlineSeconds 600; its
pod template's dnsPolicy, restartPolicy, schedulerName, securityContext `{}`,
terminationGracePeriodSeconds 30, each container's imagePullPolicy (Always for `:latest` or
no tag), terminationMessagePath/Policy, port protocol TCP, probe timings and HTTP scheme, a
fieldRef's apiVersion, volume defaultMode 420, and the template's `creationTimestamp: null`
(Go's zero time, which 1.32 still serialises); a Service's type ClusterIP, sessionAffinity
None, internalTrafficPolicy Cluster, port protocol TCP, targetPort = port, and on create a
ClusterIP from 10.96.0.0/12 with SingleStack IPv4; a PVC's volumeMode Filesystem. A create
resets `status` (Deployment `{}`, Service `{loadBalancer: {}}`, PVC `{phase: Pending}`) and
a Deployment carries `metadata.generation`.

Validation (422 `Invalid`, the apiserver's wording) covers what a manifest gets wrong most:
required fields, a Deployment's empty or non-matching selector (immutable afterwards),
container names, image and volume mounts naming no volume, restartPolicy other than Always;
a Service without ports; a Role rule without verbs or API groups; a RoleBinding's roleRef
(kind, apiGroup, immutable) and subjects. No controller runs: a Deployment's status stays
`{}`, no pod or endpoint appears.
"""

from __future__ import annotations

import ipaddress
import itertools
import re
from collections.abc import Callable
from typing import Any

from prospero.testkit.fake_kube import typed

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SERVICE_NET = ipaddress.ip_network("10.96.0.0/12")
_RBAC = "rbac.authorization.k8s.io"


def _cause(reason: str, field: str, message: str) -> dict[str, Any]:
    return {"reason": reason, "message": message, "field": field}


def _required(field: str, detail: str = "") -> dict[str, Any]:
    return _cause("FieldValueRequired", field, "Required value" + (f": {detail}" if detail else ""))


# defaults ---------------------------------------------------------------------------------


def _probe(p: dict[str, Any] | None) -> None:
    if not isinstance(p, dict):
        return
    for k, v in (("timeoutSeconds", 1), ("periodSeconds", 10), ("successThreshold", 1), ("failureThreshold", 3)):
        p.setdefault(k, v)
    http = p.get("httpGet")
    if isinstance(http, dict):
        http.setdefault("path", "/")
        http.setdefault("scheme", "HTTP")


def _pull_policy(image: str) -> str:
    ref = image.split("@", 1)
    if len(ref) == 2:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _container(c: dict[str, Any]) -> None:
    if isinstance(c.get("image"), str) and c["image"]:
        c.setdefault("imagePullPolicy", _pull_policy(c["image"]))
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    for p in c.get("ports") or []:
        if isinstance(p, dict):
            p.setdefault("protocol", "TCP")
    for k in ("livenessProbe", "readinessProbe", "startupProbe"):
        _probe(c.get(k))
    for e in c.get("env") or []:
        ref = ((e or {}).get("valueFrom") or {}).get("fieldRef")
        if isinstance(ref, dict):
            ref.setdefault("apiVersion", "v1")


_SOURCES_WITH_MODE = ("secret", "configMap", "downwardAPI", "projected")


def _pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    if spec.get("securityContext") is None:
        spec["securityContext"] = {}
    spec.setdefault("terminationGracePeriodSeconds", 30)
    for c in itertools.chain(spec.get("initContainers") or [], spec.get("containers") or []):
        if isinstance(c, dict):
            _container(c)
    for v in spec.get("volumes") or []:
        if not isinstance(v, dict):
            continue
        if set(v) <= {"name"}:
            v["emptyDir"] = {}
        for src in _SOURCES_WITH_MODE:
            if isinstance(v.get(src), dict):
                v[src].setdefault("defaultMode", 420)


def _deployment(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    spec.setdefault("replicas", 1)
    strategy = spec.setdefault("strategy", {})
    strategy.setdefault("type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate":
        ru = strategy.setdefault("rollingUpdate", {})
        ru.setdefault("maxUnavailable", "25%")
        ru.setdefault("maxSurge", "25%")
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    template = spec.get("template")
    if isinstance(template, dict):
        meta = template.setdefault("metadata", {})
        if isinstance(meta, dict):
            meta.setdefault("creationTimestamp", None)
        if isinstance(template.get("spec"), dict):
            _pod_spec(template["spec"])


def _service(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec["type"] in ("ClusterIP", "NodePort", "LoadBalancer"):
        spec.setdefault("internalTrafficPolicy", "Cluster")
    if spec["type"] in ("NodePort", "LoadBalancer"):
        spec.setdefault("externalTrafficPolicy", "Cluster")
    for p in spec.get("ports") or []:
        if isinstance(p, dict):
            p.setdefault("protocol", "TCP")
            if p.get("targetPort") in (None, 0, "") and "port" in p:
                p["targetPort"] = p["port"]


def _pvc(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict):
        spec.setdefault("volumeMode", "Filesystem")


_DEFAULTS = {"Deployment": _deployment, "Service": _service, "PersistentVolumeClaim": _pvc}


# server-owned parts -----------------------------------------------------------------------

_STATUS_ON_CREATE: dict[str, Any] = {
    "Deployment": {},
    "Service": {"loadBalancer": {}},
    "PersistentVolumeClaim": {"phase": "Pending"},
}


class Allocator:
    """ClusterIPs from the service range: the lowest one no stored Service holds, above
    10.96.0.10 (a real cluster's `kubernetes` and DNS Services). Computed from the store, so a
    dry run allocates nothing."""

    def __init__(self, in_use: Callable[[], set[str]]) -> None:
        self._in_use = in_use

    def allocate(self) -> str:
        used = self._in_use()
        for i in itertools.count(11):
            ip = str(_SERVICE_NET.network_address + i)
            if ip not in used:
                return ip
        raise AssertionError("unreachable")


def on_create(kind: str, obj: dict[str, Any], ips: Allocator) -> None:
    if kind in _STATUS_ON_CREATE:
        import copy

        obj["status"] = copy.deepcopy(_STATUS_ON_CREATE[kind])
    if kind == "Service":
        spec = obj.setdefault("spec", {})
        if spec.get("type") != "ExternalName":
            if not spec.get("clusterIP"):
                spec["clusterIP"] = ips.allocate()
            if spec["clusterIP"] != "None":
                spec.setdefault("clusterIPs", [spec["clusterIP"]])
                spec.setdefault("ipFamilies", ["IPv4"])
                spec.setdefault("ipFamilyPolicy", "SingleStack")
            else:
                spec.setdefault("clusterIPs", ["None"])
                spec.setdefault("ipFamilies", ["IPv4"])
                spec.setdefault("ipFamilyPolicy", "SingleStack")


def on_update(kind: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """An update that leaves out what the server allocated keeps it (a Service's IPs)."""
    if kind == "Service" and isinstance(new.get("spec"), dict):
        for k in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
            if k in (old.get("spec") or {}) and not new["spec"].get(k):
                new["spec"][k] = old["spec"][k]


# validation -------------------------------------------------------------------------------


def _selector_matches(selector: dict[str, Any], labels: dict[str, Any]) -> bool:
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for req in selector.get("matchExpressions") or []:
        key, op, values = req.get("key"), req.get("operator"), req.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _go_map(m: dict[str, Any]) -> str:
    return "map[string]string{" + ", ".join(f'"{k}":"{v}"' for k, v in sorted(m.items())) + "}"


def _pod_template_causes(spec: dict[str, Any], at: str) -> list[dict[str, Any]]:
    causes: list[dict[str, Any]] = []
    volumes = {v.get("name") for v in spec.get("volumes") or [] if isinstance(v, dict)}
    seen: set[str] = set()
    for i, c in enumerate(spec.get("containers") or []):
        here = f"{at}.containers[{i}]"
        name = c.get("name") or ""
        if name and not _DNS1123_LABEL.match(name):
            causes.append(_cause("FieldValueInvalid", f"{here}.name", f'Invalid value: "{name}": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \'-\', and must start and end with an alphanumeric character'))
        if name in seen:
            causes.append(_cause("FieldValueDuplicate", f"{here}.name", f'Duplicate value: "{name}"'))
        seen.add(name)
        if not c.get("image"):
            causes.append(_required(f"{here}.image"))
        for j, m in enumerate(c.get("volumeMounts") or []):
            if m.get("name") and m["name"] not in volumes:
                causes.append(_cause("FieldValueNotFound", f"{here}.volumeMounts[{j}].name", f'Not found: "{m["name"]}"'))
    policy = spec.get("restartPolicy")
    if policy and policy != "Always":
        causes.append(_cause("FieldValueNotSupported", f"{at}.restartPolicy", f'Unsupported value: "{policy}": supported values: "Always"'))
    return causes


def _deployment_causes(obj: dict[str, Any], old: dict[str, Any] | None) -> list[dict[str, Any]]:
    spec = obj.get("spec") or {}
    causes: list[dict[str, Any]] = []
    selector = spec.get("selector") or {}
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        causes.append(_cause("FieldValueInvalid", "spec.selector", "Invalid value: v1.LabelSelector{MatchLabels:map[string]string(nil), MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: empty selector is invalid for deployment"))
    elif not _selector_matches(selector, labels):
        causes.append(_cause("FieldValueInvalid", "spec.template.metadata.labels", f"Invalid value: {_go_map(labels)}: `selector` does not match template `labels`"))
    if old is not None and (old.get("spec") or {}).get("selector") != selector:
        causes.append(_cause("FieldValueInvalid", "spec.selector", f"Invalid value: {selector}: field is immutable"))
    replicas = spec.get("replicas")
    if isinstance(replicas, int) and replicas < 0:
        causes.append(_cause("FieldValueInvalid", "spec.replicas", f"Invalid value: {replicas}: must be greater than or equal to 0"))
    if isinstance(template.get("spec"), dict):
        causes += _pod_template_causes(template["spec"], "spec.template.spec")
    return causes


def _service_causes(obj: dict[str, Any], old: dict[str, Any] | None) -> list[dict[str, Any]]:
    spec = obj.get("spec") or {}
    causes: list[dict[str, Any]] = []
    ports = spec.get("ports") or []
    if spec.get("type") != "ExternalName" and spec.get("clusterIP") != "None" and not ports:
        causes.append(_required("spec.ports"))
    if len(ports) > 1:
        for i, p in enumerate(ports):
            if not p.get("name"):
                causes.append(_required(f"spec.ports[{i}].name"))
    return causes


def _role_causes(obj: dict[str, Any], old: dict[str, Any] | None) -> list[dict[str, Any]]:
    causes: list[dict[str, Any]] = []
    for i, rule in enumerate(obj.get("rules") or []):
        if not rule.get("verbs"):
            causes.append(_required(f"rules[{i}].verbs", "verbs must contain at least one value"))
        if rule.get("resources") and not rule.get("apiGroups"):
            causes.append(_required(f"rules[{i}].apiGroups", "resource rules must supply at least one api group"))
        if not rule.get("resources") and not rule.get("nonResourceURLs"):
            causes.append(_required(f"rules[{i}].resources", "resource rules must supply at least one resource"))
        if rule.get("nonResourceURLs"):
            causes.append(_cause("FieldValueInvalid", f"rules[{i}].nonResourceURLs", "Invalid value: []string{...}: namespaced rules cannot apply to non-resource URLs"))
    return causes


def _rolebinding_causes(obj: dict[str, Any], old: dict[str, Any] | None) -> list[dict[str, Any]]:
    causes: list[dict[str, Any]] = []
    ref = obj.get("roleRef") or {}
    if ref.get("apiGroup") != _RBAC:
        causes.append(_cause("FieldValueNotSupported", "roleRef.apiGroup", f'Unsupported value: "{ref.get("apiGroup", "")}": supported values: "{_RBAC}"'))
    if ref.get("kind") not in ("Role", "ClusterRole"):
        causes.append(_cause("FieldValueNotSupported", "roleRef.kind", f'Unsupported value: "{ref.get("kind", "")}": supported values: "Role", "ClusterRole"'))
    if old is not None and (old.get("roleRef") or {}) != ref:
        causes.append(_cause("FieldValueInvalid", "roleRef", f"Invalid value: {ref}: cannot change roleRef"))
    for i, s in enumerate(obj.get("subjects") or []):
        kind = s.get("kind")
        if kind == "ServiceAccount":
            if s.get("apiGroup"):
                causes.append(_cause("FieldValueNotSupported", f"subjects[{i}].apiGroup", f'Unsupported value: "{s["apiGroup"]}": supported values: ""'))
        elif kind in ("User", "Group"):
            if s.get("apiGroup") != _RBAC:
                causes.append(_cause("FieldValueNotSupported", f"subjects[{i}].apiGroup", f'Unsupported value: "{s.get("apiGroup", "")}": supported values: "{_RBAC}"'))
        else:
            causes.append(_cause("FieldValueNotSupported", f"subjects[{i}].kind", f'Unsupported value: "{kind}": supported values: "ServiceAccount", "User", "Group"'))
    return causes


def _subject_defaults(obj: dict[str, Any]) -> None:
    for s in obj.get("subjects") or []:
        if isinstance(s, dict) and s.get("kind") in ("User", "Group"):
            s.setdefault("apiGroup", _RBAC)


_CAUSES = {
    "Deployment": _deployment_causes,
    "Service": _service_causes,
    "Role": _role_causes,
    "RoleBinding": _rolebinding_causes,
}


def check(rt: Any, obj: dict[str, Any], old: dict[str, Any] | None) -> tuple[list[str], list[dict[str, Any]]]:
    """Decode (type errors raise 400), drop unknown fields (returned, for Strict/Warn),
    default, validate. Returns (unknown field paths, 422 causes)."""
    outcome = typed.check(rt.model, rt.kind, rt.version, obj)
    for path in outcome.unknown:
        _drop(obj, path)
    causes = [_required(p) for p in outcome.required]
    if rt.kind in _DEFAULTS:
        _DEFAULTS[rt.kind](obj)
    if rt.kind == "RoleBinding":
        _subject_defaults(obj)
    if not causes and rt.kind in _CAUSES:
        causes += _CAUSES[rt.kind](obj, old)
    return outcome.unknown, causes


def _drop(obj: dict[str, Any], path: str) -> None:
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    cur: Any = obj
    for p in parts[:-1]:
        cur = cur[int(p[1:-1])] if p.startswith("[") else cur.get(p)
        if cur is None:
            return
    if isinstance(cur, dict):
        cur.pop(parts[-1], None)
