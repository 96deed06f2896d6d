"""A throwaway PKI (openssl) and a TLS server on 127.0.0.1 that requires a client certificate.

For the transport's and the loader's TLS tests: the CA is verified (a server certificate
for ``kubernetes.default.svc`` only, so the name checked matters), and the client
certificate presented is what the server answers with.
"""

from __future__ import annotations

import http.server
import json
import shutil
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_pki(base: Path, *, server_names: str = "DNS:kubernetes.default.svc") -> Pki:
    """A CA, a server certificate for ``server_names`` (kubernetes.default.svc only), a
    client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str | Path) -> None:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True,
                       timeout=30)

    openssl("req", "-x509", *curve, "-keyout", base / "ca.key", "-out", base / "ca.crt",
            "-days", "1", "-subj", "/CN=test-ca")
    for name, extension in (("server", f"subjectAltName={server_names}"),
                            ("client", "extendedKeyUsage=clientAuth")):
        (base / f"{name}.ext").write_text(extension + "\n")
        openssl("req", *curve, "-keyout", base / f"{name}.key", "-out", base / f"{name}.csr",
                "-subj", f"/CN=himitsu-{name}")
        openssl("x509", "-req", "-in", base / f"{name}.csr", "-CA", base / "ca.crt",
                "-CAkey", base / "ca.key", "-CAcreateserial", "-days", "1",
                "-out", base / f"{name}.crt", "-extfile", base / f"{name}.ext")
    return Pki(base / "ca.crt", base / "server.crt", base / "server.key",
               base / "client.crt", base / "client.key")


class TlsApiServer:
    """Answers every GET with who the client certificate names; requires one."""

    def __init__(self, pki: Pki) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki.server_cert, pki.server_key)
        context.load_verify_locations(pki.ca)
        context.verify_mode = ssl.CERT_REQUIRED

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                peer: Any = self.connection.getpeercert()
                subject = dict(item for rdn in peer["subject"] for item in rdn)
                raw = json.dumps({"client": subject["commonName"],
                                  "auth": self.headers.get("Authorization")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
