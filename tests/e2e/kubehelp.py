"""Small Kubernetes helpers for the e2e suite: raw JSON requests, kubectl, waiting.

Why not the operator's own REST layer: the suite checks the operator, so it talks to the
apiserver through independent code (the official client's transport, nothing of ours).
Why not the client's generated API classes: tests compare the exact JSON the apiserver
stores (byte-stable data, annotations, resourceVersions), which the models reshape.

Waiting is always "poll a predicate until a deadline", never a fixed sleep: a test is as
fast as the cluster, and a timeout says what was awaited and what was last seen.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

from kubernetes import client as k8s
from kubernetes.config.kube_config import load_kube_config

REPO = Path(__file__).resolve().parents[2]
HSEC_API = "/apis/himitsu.io/v1alpha1"
POLL_INTERVAL = 0.1

T = TypeVar("T")


class ApiError(Exception):
    """A non-2xx answer from the apiserver (status and the Status message)."""

    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        self.status = status
        try:
            message = str(json.loads(body).get("message", ""))
        except (ValueError, AttributeError):
            message = body[:200].decode("utf-8", "replace")
        self.message = message
        super().__init__(f"{method} {path}: {status} {message}")


class KubeApi:
    """Raw JSON requests with the credentials of one kubeconfig (admin for the tests)."""

    def __init__(self, kubeconfig: str | os.PathLike[str]) -> None:
        self.kubeconfig = str(kubeconfig)
        configuration = k8s.Configuration()
        load_kube_config(config_file=self.kubeconfig,  # type: ignore[no-untyped-call]
                         client_configuration=configuration, persist_config=False)
        self.server = str(configuration.host)
        self._client = k8s.ApiClient(configuration)

    def request(self, method: str, path: str, *, body: Any = None,
                query: Mapping[str, Any] | None = None,
                content_type: str = "application/json") -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        _, url, headers, _, _ = self._client.param_serialize(
            method=method, resource_path=path, header_params=headers,
            auth_settings=["BearerToken"])
        if query:
            url += "?" + urlencode(query)
        response = self._client.call_api(method, url, header_params=headers, body=body,
                                         _request_timeout=30)
        raw = response.response
        data: bytes = raw.data
        if not 200 <= raw.status < 300:
            raise ApiError(method, path, raw.status, data)
        return json.loads(data) if data else None

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query or None)

    def get_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = self.request("POST", path, body=dict(body))
        return created

    def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        replaced: dict[str, Any] = self.request("PUT", path, body=dict(body))
        return replaced

    def merge_patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        patched: dict[str, Any] = self.request(
            "PATCH", path, body=dict(body), content_type="application/merge-patch+json")
        return patched

    def delete(self, path: str, *, missing_ok: bool = True, **query: Any) -> None:
        try:
            self.request("DELETE", path, query=query or None)
        except ApiError as exc:
            if not (missing_ok and exc.status == 404):
                raise

    # -- paths and typed shortcuts ---------------------------------------------------------
    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get_or_none(secret_path(namespace, name))

    def hsec(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get_or_none(hsec_path(namespace, name))

    def events(self, namespace: str, *, kind: str | None = None,
               name: str | None = None) -> list[dict[str, Any]]:
        selectors = []
        if kind:
            selectors.append(f"involvedObject.kind={kind}")
        if name:
            selectors.append(f"involvedObject.name={name}")
        query = {"fieldSelector": ",".join(selectors)} if selectors else {}
        items: list[dict[str, Any]] = self.get(
            f"/api/v1/namespaces/{namespace}/events", **query)["items"]
        return items


def secret_path(namespace: str, name: str | None = None) -> str:
    base = f"/api/v1/namespaces/{namespace}/secrets"
    return f"{base}/{quote(name)}" if name else base


def hsec_path(namespace: str, name: str | None = None) -> str:
    base = f"{HSEC_API}/namespaces/{namespace}/himitsusecrets"
    return f"{base}/{quote(name)}" if name else base


def decoded(secret: Mapping[str, Any] | None) -> dict[str, str]:
    """A Secret's data, base64-decoded (UTF-8)."""
    data = (secret or {}).get("data") or {}
    return {k: base64.b64decode(v).decode("utf-8") for k, v in data.items()}


def rv(obj: Mapping[str, Any] | None) -> str | None:
    return None if obj is None else str(obj["metadata"]["resourceVersion"])


def ready(hsec: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The Ready condition of a HimitsuSecret, or None."""
    for cond in ((hsec or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            found: dict[str, Any] = cond
            return found
    return None


def is_ready(hsec: Mapping[str, Any] | None, *, reason: str = "Synced") -> bool:
    cond = ready(hsec)
    wanted = "True" if reason == "Synced" else "False"
    return cond is not None and cond.get("status") == wanted and cond.get("reason") == reason


# -- waiting -------------------------------------------------------------------------------
def wait_for(predicate: Callable[[], T | None], *, timeout: float, what: str,
             interval: float = POLL_INTERVAL) -> T:
    """Poll ``predicate`` until it returns something truthy; return that value.

    Exceptions from the predicate count as "not yet" (the object may not exist yet); on
    timeout the AssertionError names ``what`` and the last value or exception seen.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
        except (ApiError, KeyError, TypeError, ValueError, OSError) as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; "
                                 f"last seen: {_short(last)}")
        time.sleep(interval)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 600 else text[:600] + "..."


# -- kubectl -------------------------------------------------------------------------------
def kubectl_binary() -> str:
    """The kubectl built with the local control plane, else the one on PATH."""
    bin_dir = os.environ.get("E2E_KUBE_BIN_DIR") or REPO / "hack" / "kube" / "bin"
    built = Path(bin_dir) / "kubectl"
    if built.is_file() and os.access(built, os.X_OK):
        return str(built)
    found = shutil.which("kubectl")
    if found is None:
        raise RuntimeError("no kubectl: run `bash hack/kube/build.sh` or put kubectl on PATH")
    return found


def dies_with_caller(cmd: list[str]) -> list[str]:
    """``cmd`` under ``setpriv --pdeathsig TERM`` (where util-linux has it): the kernel
    sends it SIGTERM when the thread that started it dies, so a killed pytest leaves no
    ``kubectl port-forward`` or ``logs -f`` behind (they run in their own session)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *cmd] if setpriv else cmd


def kubectl(kubeconfig: str, *args: str, check: bool = True,
            stdin: str | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run kubectl against ``kubeconfig``; output captured as text."""
    cmd = [kubectl_binary(), f"--kubeconfig={kubeconfig}", *args]
    result = subprocess.run(cmd, input=stdin, capture_output=True, text=True,
                            timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd[1:])} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result
