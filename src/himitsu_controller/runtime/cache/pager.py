"""How the informer LISTs: client-go's reflector ``list()`` and its pager, on raw dicts.

* The resourceVersion of a LIST decides whether kube-apiserver answers from its watch
  cache or from etcd: lists and relists are asked so the cache answers.
* In pages where the watch cache serves them so (kube-apiserver 1.34+): only one page is
  ever decoded whole. Older servers keep client-go's one-page rules.
* An expired or too large resourceVersion lists again at the latest one, paginated.

Design: docs/design/informers.md
"""

from __future__ import annotations

import re
import threading
from collections.abc import Collection, Mapping
from typing import Any

import structlog

from himitsu_controller.runtime.cache.store import Transform, apply, object_key, resource_version
from himitsu_controller.runtime.client.errors import (
    ApiError,
    TransportError,
    is_resource_expired,
    is_too_large_resource_version,
)
from himitsu_controller.runtime.client.rest import Resource, RestClient

__all__ = ["LIST_PAGES", "Pager", "lists_from_snapshots"]

log = structlog.get_logger(__name__)

Object = dict[str, Any]
Listing = tuple[dict[str, Object], str]  # objects by key, the list's resourceVersion
# The first kube-apiserver minor whose watch cache serves paginated lists (list snapshots,
# ListFromCacheSnapshot: beta and on by default in 1.34).
SNAPSHOT_MINOR = 34
# --list-pages: "auto" pages on servers whose version says they can, "off" never.
LIST_PAGES = ("auto", "off")
# "1.34+" (major.minor, "+" on some managed offerings) or "v1.34.2-eks-1" (gitVersion).
_MAJOR_MINOR = re.compile(r"v?(\d+)[^.]*\.(\d+)")


class Pager:
    """LISTs one resource (namespace, selectors) with the reflector's resourceVersions."""

    def __init__(self, rest: RestClient, resource: Resource, *, namespace: str | None,
                 selectors: Mapping[str, str | None], page_size: int, name: str,
                 transform: Transform | None = None, shared: Collection[str] = (),
                 snapshots: bool = False) -> None:
        """``transform`` reduces each item page by page (``store.apply``);
        ``snapshots``: see ``lists_from_snapshots``."""
        self._rest = rest
        self._transform = transform
        self._shared = shared
        self._resource = resource
        self._namespace = namespace if resource.namespaced else None
        self._selectors = dict(selectors)
        self._page_size = page_size
        self._name = name
        # The first list (resourceVersion=0) came back in pages: no watch cache to prefer.
        self._paginated = False
        # The last list at the informer's resourceVersion found it expired or too large.
        self._unavailable = False
        self._snapshots = snapshots

    def _version_for(self, last_seen: str) -> str:
        """client-go's relistResourceVersion: "" after an unavailable one, "0" at first
        ("" with list snapshots: "0" would come in one page)."""
        if self._unavailable:
            return ""
        return last_seen or ("" if self._snapshots else "0")

    def list(self, last_seen: str, stop: threading.Event) -> Listing | None:
        """Every object, and the resourceVersion to watch from; None when ``stop`` is set."""
        version = self._version_for(last_seen)
        try:
            listed = self._list_at(version, stop)
        except ApiError as exc:
            if not (is_resource_expired(exc) or is_too_large_resource_version(exc)):
                raise
            log.info("resource version unavailable, listing at the latest", informer=self._name,
                     resource_version=version, status=exc.status, reason=exc.reason)
            self._unavailable = True
            listed = self._list_at(self._version_for(last_seen), stop)
        if listed is None:
            return None
        items, listed_version, paginated = listed
        if version == "0" and paginated:
            self._paginated = True
        self._unavailable = False
        return items, listed_version

    def _list_at(self, version: str, stop: threading.Event, *, restarts: int = 1,
                 ) -> tuple[dict[str, Object], str, bool] | None:
        limit: int | None = self._page_size
        match = None
        if version not in ("", "0"):
            if self._snapshots:
                match = "NotOlderThan"  # paginated, and still the watch cache's
            elif not self._paginated:
                limit = None  # unpaginated at a known version: the watch cache serves it
        first: dict[str, Any] = {**self._selectors, "resourceVersion": version or None,
                                 "resourceVersionMatch": match, "limit": limit}
        query = first
        items: dict[str, Object] = {}
        paginated = False
        while True:
            if stop.is_set():
                return None
            try:
                page = self._rest.list(self._resource, namespace=self._namespace, query=query)
            except ApiError as exc:
                if "continue" not in query or exc.status != 410:
                    raise
                items = {}  # of another snapshot than the listing that follows
                if self._snapshots and restarts > 0:
                    log.info("list continue token expired, listing again from the start",
                             informer=self._name)
                    return self._list_at("", stop, restarts=restarts - 1)
                log.info("list continue token expired, listing again in one page",
                         informer=self._name)
                page = self._rest.list(self._resource, namespace=self._namespace,
                                       query={**first, "limit": None})
                self._collect(page, items)
                return items, resource_version(page), paginated
            self._collect(page, items)
            token = (page.get("metadata") or {}).get("continue") or None
            listed = resource_version(page)
            del page  # this page's whole objects go before the next one is decoded
            if token is None:
                return items, listed, paginated
            query = {**self._selectors, "limit": limit, "continue": token}
            paginated = True

    def keep(self, obj: Object) -> Object | None:
        """``obj`` as the store keeps it (``store.apply``); None: not kept."""
        return apply(self._transform, obj, informer=self._name, shared=self._shared)

    def _collect(self, page: Mapping[str, Any], items: dict[str, Object]) -> None:
        # List items carry no apiVersion/kind; fill them in so cached objects look the
        # same whether they came from a LIST or a watch event.
        api_version = page.get("apiVersion")
        list_kind = str(page.get("kind", ""))
        kind = list_kind.removesuffix("List") if list_kind.endswith("List") else None
        for item in page.get("items") or []:
            if api_version and "apiVersion" not in item:
                item["apiVersion"] = api_version
            if kind and "kind" not in item:
                item["kind"] = kind
            kept = self.keep(item)
            if kept is not None:
                items[object_key(kept)] = kept


def lists_from_snapshots(rest: RestClient, *, pages: str = "auto") -> bool:
    """Whether to list in pages served by the watch cache (``--list-pages``): never with
    "off" (no request); with "auto" when ``/version`` says 1.34 or later. Asked once."""
    if pages == "off":
        return False
    try:
        info = rest.request("GET", "/version", timeout=15.0)
    except (ApiError, TransportError) as exc:
        log.info("server version unknown: lists of the watch cache come in one page",
                 error=str(exc))
        return False
    found = (_MAJOR_MINOR.match(f"{info.get('major') or ''}.{info.get('minor') or ''}")
             or _MAJOR_MINOR.match(str(info.get("gitVersion") or "")))  # some say only that
    snapshots = found is not None and (int(found[1]), int(found[2])) >= (1, SNAPSHOT_MINOR)
    log.info("server version", version=str(info.get("gitVersion", ""))[:40],
             paginated_lists_from_cache=snapshots)
    return snapshots
