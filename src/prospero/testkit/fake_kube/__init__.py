"""A fake Kubernetes API server for the caliban CRDs (issue 13), speaking the real protocol so
kubectl and Kubernetes client libraries can drive it: discovery, CRUD, server-side apply with
field managers, lists and watches with resourceVersion semantics, bookmarks and 410 Gone, the
status subresource, and a fake operator that moves CalibanTask phases.

Modules: `store` (revisions, event log, compaction), `resources` (types, discovery), `verbs`
(API semantics), `managed` (managedFields, apply), `patches`, `schema` (CRD validation),
`selectors`, `app` (HTTP, watch), `operator`, `server` (`FakeKube`), `__main__` (standalone).
"""

from prospero.testkit.fake_kube.server import FakeKube

__all__ = ["FakeKube"]
