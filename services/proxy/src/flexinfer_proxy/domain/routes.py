"""The proxy's view of every managed model (from the routes KV bucket) and how a request's ``model`` resolves.

Resolution, in order:

1. ``namespace/name``: that model exactly (else a service label carried by a model of that namespace);
2. a bare name: the model of that name in the proxy's default namespace, else the only model of that name in any
   namespace;
3. a service label: the Ready model carrying it, else the best one carrying it (highest priority, then name), so
   the request queues for it and its demand makes it load;
4. otherwise 404 ``model_not_found`` (or 400 ``model_ambiguous`` when the bare name exists in several namespaces).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from flexinfer_common.keys import ModelKey
from flexinfer_common.messages import Route
from flexinfer_proxy.domain.errors import model_ambiguous, model_not_found


def key_of(route: Route) -> ModelKey:
    return ModelKey(route.namespace, route.name)


class ResolvedBy(StrEnum):
    QUALIFIED = "namespace/name"
    NAME = "name"
    SERVICE_LABEL = "service-label"


@dataclass(frozen=True, slots=True)
class Resolved:
    key: ModelKey
    route: Route
    by: ResolvedBy


def _preference(route: Route) -> tuple[int, str, str]:
    """Sort key: the best model first (highest priority, then name, then namespace)."""
    return (-route.priority, route.name, route.namespace)


class RouteTable:
    """Every known route, indexed by (namespace, name), by name, and by service label. No I/O."""

    def __init__(self, routes: Iterable[Route] = ()) -> None:
        self._routes: dict[ModelKey, Route] = {}
        self._by_name: dict[str, dict[str, ModelKey]] = {}
        self._by_label: dict[str, set[ModelKey]] = {}
        self._suspected: dict[ModelKey, Route] = {}  # key -> its route from the KV, while ``suspect`` replaces it
        #: Counts every change, so a resolution cached at one version is known to be stale at another.
        self.version = 0
        for route in routes:
            self.put(route)

    def __len__(self) -> int:
        return len(self._routes)

    def __iter__(self) -> Iterator[Route]:
        return iter(sorted(self._routes.values(), key=lambda r: (r.namespace, r.name)))

    def __contains__(self, key: object) -> bool:
        return key in self._routes

    def keys(self) -> set[ModelKey]:
        return set(self._routes)

    def get(self, key: ModelKey) -> Route | None:
        return self._routes.get(key)

    def put(self, route: Route) -> ModelKey:
        """Add or replace a route (it ends a ``suspect`` mark of the model); return its key."""
        key = key_of(route)
        self._suspected.pop(key, None)
        self._store(key, route)
        return key

    def suspect(self, key: ModelKey, route: Route) -> bool:
        """Treat the model as not Ready locally: connecting to ``route``'s endpoint failed. Only when ``route`` is
        still the model's Ready route here (else a newer one came, or it is marked already): False then.
        The mark ends with ``unsuspect``, or at once when a route for the model comes (``put``, ``replace``)."""
        if self._routes.get(key) is not route or not route.ready:
            return False
        self._suspected[key] = route
        self._store(key, route.model_copy(update={"ready": False}))
        return True

    def unsuspect(self, key: ModelKey, route: Route) -> bool:
        """Put back ``route``, which ``suspect`` replaced, unless a newer route came meanwhile; True when it did."""
        if self._suspected.get(key) is not route:
            return False
        del self._suspected[key]
        self._store(key, route)
        return True

    def _store(self, key: ModelKey, route: Route) -> None:
        self.version += 1
        self._unindex(key)
        self._routes[key] = route
        self._by_name.setdefault(route.name, {})[route.namespace] = key
        for label in route.service_labels:
            self._by_label.setdefault(label, set()).add(key)

    def remove(self, key: ModelKey) -> Route | None:
        """Forget a model; return the route it had."""
        self.version += 1
        self._suspected.pop(key, None)
        route = self._unindex(key)
        self._routes.pop(key, None)
        return route

    def replace(self, routes: Iterable[Route]) -> set[ModelKey]:
        """Make the table exactly ``routes``; return the keys that changed, appeared or disappeared."""
        new = {key_of(route): route for route in routes}
        changed = {key for key in self._routes if key not in new}
        changed |= {key for key, route in new.items() if self._routes.get(key) != route}
        for key in [k for k in self._routes if k not in new]:
            self.remove(key)
        for key, route in new.items():
            if self._routes.get(key) != route:
                self.put(route)
        return changed

    def _unindex(self, key: ModelKey) -> Route | None:
        old = self._routes.get(key)
        if old is None:
            return None
        names = self._by_name.get(old.name)
        if names is not None:
            names.pop(old.namespace, None)
            if not names:
                del self._by_name[old.name]
        for label in old.service_labels:
            keys = self._by_label.get(label)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_label[label]
        return old

    def resolve(self, model: str, *, default_namespace: str) -> Resolved:
        """Find the model a request names (see the module docstring); raise ProxyError 404/400 when none fits."""
        if "/" in model:
            namespace, _, name = model.partition("/")
            key = ModelKey(namespace, name)
            route = self._routes.get(key)
            if route is not None:
                return Resolved(key, route, ResolvedBy.QUALIFIED)
            labelled = self._by_label_in(name, namespace)
            if labelled is not None:
                return labelled
            raise model_not_found(model)

        namespaces = self._by_name.get(model)
        if namespaces:
            key_in_default = namespaces.get(default_namespace)
            if key_in_default is not None:
                return Resolved(key_in_default, self._routes[key_in_default], ResolvedBy.NAME)
            if len(namespaces) == 1:
                (only,) = namespaces.values()
                return Resolved(only, self._routes[only], ResolvedBy.NAME)
        labelled = self._by_label_in(model, None)
        if labelled is not None:
            return labelled
        if namespaces:
            raise model_ambiguous(model, sorted(namespaces))
        raise model_not_found(model)

    def aliases(self) -> list[tuple[str, Resolved]]:
        """Every service label that is not also a model's name, with the model a request for it goes to now."""
        found = []
        for label in sorted(self._by_label):
            if label in self._by_name:
                continue  # a request for it goes to the model of that name
            resolved = self._by_label_in(label, None)
            if resolved is not None:
                found.append((label, resolved))
        return found

    def _by_label_in(self, label: str, namespace: str | None) -> Resolved | None:
        keys = self._by_label.get(label)
        if not keys:
            return None
        routes = [self._routes[k] for k in keys if namespace is None or k.namespace == namespace]
        if not routes:
            return None
        ready = [r for r in routes if r.ready]
        best = min(ready or routes, key=_preference)
        return Resolved(key_of(best), best, ResolvedBy.SERVICE_LABEL)
