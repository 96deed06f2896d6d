"""A validating admission webhook served from the test process (local control plane only).

Why: a webhook may deny with any code and reason, 409 AlreadyExists included (a
uniqueness rule), and its text may quote what it refused; only a real apiserver shows
how such a denial reaches the operator. The server speaks AdmissionReview v1 over TLS
with a throwaway self-signed certificate for 127.0.0.1 (made with the openssl CLI).
"""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .kubehelp import KubeApi

WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
Decide = Callable[[dict[str, Any]], dict[str, Any] | None]  # object -> denial Status or None


def _certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "webhook.crt", directory / "webhook.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True)
    return cert, key


def _handler(decide: Decide,
             seen: list[dict[str, Any]]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            request = review["request"]
            seen.append({"operation": request["operation"], "dryRun": request.get("dryRun")})
            denial = decide(request.get("object") or {})
            response: dict[str, Any] = {"uid": request["uid"], "allowed": denial is None}
            if denial is not None:
                response["status"] = denial
            body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                               "response": response}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def webhook(kube: KubeApi, ns: str, directory: Path, *, name: str,
            decide: Decide) -> Iterator[list[dict[str, Any]]]:
    """Serve ``decide`` as webhook ``name`` for Secret CREATEs in ``ns``; yields the
    requests it saw. Removed (configuration and server) on exit."""
    cert, key = _certificate(directory)
    seen: list[dict[str, Any]] = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(decide, seen))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = f"{ns}-{name}"[:63].rstrip("-.")
    kube.create(WEBHOOKS, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": config},
        "webhooks": [{
            "name": name,
            "clientConfig": {"url": f"https://127.0.0.1:{server.server_address[1]}/validate",
                             "caBundle": base64.b64encode(cert.read_bytes()).decode()},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["secrets"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail", "timeoutSeconds": 5,
        }],
    })
    try:
        yield seen
    finally:
        kube.delete(f"{WEBHOOKS}/{config}")
        server.shutdown()
        server.server_close()
