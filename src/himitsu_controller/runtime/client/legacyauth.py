"""Credentials our loader does not implement, from the ``kubernetes`` package's loader.

Only for a kubeconfig user with a legacy ``auth-provider`` (gcp, azure, oidc: removed
from kubectl in 1.26 in favour of exec plugins) or ``username``/``password``. This is the
only module that imports ``kubernetes``, and ``kubeconfig.py`` imports it only for such a
user: everyone else is spared its ~16 MiB.

The package's loader is given the user's stanza and a cluster with nothing but its
server (our own loader does the TLS), and installs a refresh hook that it means to run
before *every* request: it re-applies the credentials and reloads any that have an
expiry once it passed. Here it runs at most every ``every`` seconds (and at once after a
401): credentials are still refreshed within that long of expiring.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from himitsu_controller.runtime.client.credentials import Auth

__all__ = ["LegacyCredentials", "credentials"]

REFRESH_SECONDS = 5.0


class LegacyCredentials:
    """The Authorization header of a kubernetes ``Configuration``, refreshed by its hook."""

    def __init__(self, configuration: Any, *, every: float = REFRESH_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._configuration = configuration
        self._every = every
        self._clock = clock
        self._last = float("-inf")
        self._auth = Auth()
        self._lock = threading.Lock()

    def current(self) -> Auth:
        with self._lock:
            now = self._clock()
            if now - self._last >= self._every:
                self._last = now
                hook = self._configuration.refresh_api_key_hook
                if hook is not None:
                    hook(self._configuration)  # may re-install a hook of its own: fine
                value = self._configuration.auth_settings().get("BearerToken", {}).get("value")
                self._auth = Auth(str(value) if value else None)
            return self._auth

    def refused(self, auth: Auth) -> None:
        with self._lock:
            if auth == self._auth:
                self._last = float("-inf")


def credentials(document: dict[str, Any], context: str, base: str) -> LegacyCredentials:
    """The credentials of ``context``'s user in a merged kubeconfig ``document``."""
    from kubernetes import client as k8s  # noqa: PLC0415 (only for such a user)
    from kubernetes.config.kube_config import KubeConfigLoader  # noqa: PLC0415

    contexts = {c["name"]: c["context"] for c in document["contexts"]}
    user_name = contexts[context].get("user")
    cluster_name = contexts[context].get("cluster")
    # Without its client certificate: that is ours (the package would write it to a file).
    users = [{"name": u["name"], "user": {k: v for k, v in u["user"].items()
                                          if not k.startswith("client-")}}
             for u in document["users"] if u["name"] == user_name]
    clusters = [{"name": c["name"], "cluster": {"server": c["cluster"].get("server")}}
                for c in document["clusters"] if c["name"] == cluster_name]
    minimal = {"current-context": context, "contexts": [{"name": context,
                                                         "context": contexts[context]}],
               "users": users, "clusters": clusters}
    configuration = k8s.Configuration()
    loader = KubeConfigLoader(config_dict=minimal,  # type: ignore[no-untyped-call]
                              active_context=context, config_base_path=base)
    loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
    return LegacyCredentials(configuration)
