"""Client CPU per apiserver request: the kubernetes client's request path versus RestClient's.

Why a micro-benchmark of its own: in the operator's steady state (one status merge-patch
per poll) most CPU goes to the request round trip, and the full benchmark (a real control
plane, minutes per run) is too coarse to tell what a change to the request path is worth.
This one sends N merge-patches to a local HTTP server, in one process, through

  (a) ``ApiClient.param_serialize`` + ``ApiClient.call_api`` (the kubernetes client's own
      path, which RestClient used before it got a lean path of its own), reading and
      decoding the JSON answer as RestClient did, and
  (b) ``RestClient.patch`` (our own transport: runtime/client/transport.py),

alternating batches of the two, and prints the median CPU microseconds per request of the
client thread (``time.thread_time``; the server is a separate process, so its CPU is not
counted) and the ratio. Plain HTTP by default; ``--tls`` puts HTTPS (a throwaway CA made
with openssl) in between, as with a real apiserver.

    .venv/bin/python bench/rest_cost.py [--n 2000] [--batches 5] [--tls]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s

from himitsu_controller.runtime.client.rest import (
    MERGE_PATCH,
    ClientConfig,
    HttpClient,
    Resource,
    RestClient,
    bearer,
    new_api_client,
)
from himitsu_controller.runtime.client.transport import new_retry

WIDGETS = Resource("example.io", "v1", "widgets")
TOKEN = "bench-token"  # noqa: S105 (a made-up bearer token for a loopback server)
STATUS_PATCH = {"status": {"observedGeneration": 3, "secretCount": 20,
                           "conditions": [{"type": "Ready", "status": "True",
                                           "reason": "Synced", "message": "20 keys synced",
                                           "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}


def answer_object() -> bytes:
    """A ~2 KB object, about what the apiserver returns for a HimitsuSecret status patch."""
    obj: dict[str, Any] = {"apiVersion": "example.io/v1", "kind": "Widget",
           "metadata": {"name": "w", "namespace": "ns", "uid": "0" * 36,
                        "resourceVersion": "123456", "generation": 3,
                        "creationTimestamp": "2026-01-01T00:00:00Z",
                        "labels": {f"label-{i}": f"value-{i}" for i in range(4)},
                        "managedFields": [{"manager": "himitsu-controller",
                                           "operation": "Update", "apiVersion": "example.io/v1",
                                           "time": "2026-01-01T00:00:00Z",
                                           "fieldsType": "FieldsV1",
                                           "fieldsV1": {"f:status": {"f:secretCount": {}}}}]},
           "spec": {"environment": "production", "target": {"name": "app-secrets"},
                    "keys": [f"KEY_{i}" for i in range(20)]},
           "status": STATUS_PATCH["status"]}
    encoded = json.dumps(obj).encode()
    padding = max(0, 2048 - len(encoded))
    obj["metadata"]["annotations"] = {"note": "x" * padding}
    return json.dumps(obj).encode()


def serve(cert_dir: str | None) -> None:
    """The server process: answer every request with the object, print the port first."""
    body = answer_object()
    # The head the apiserver sends with a patch answer (priority-and-fairness, audit id).
    head = ("HTTP/1.1 %d OK\r\nAudit-Id: 0b6f7c1e-8d5a-4f1e-9c1a-3e2d4c5b6a79\r\n"
            "Cache-Control: no-cache, private\r\nContent-Type: application/json\r\n"
            "X-Kubernetes-Pf-Flowschema-Uid: 6a1d3c0e-2b4f-4e8a-9d7c-1f2e3d4c5b6a\r\n"
            "X-Kubernetes-Pf-Prioritylevel-Uid: 7b2e4d1f-3c5a-4f9b-8e6d-2a3b4c5d6e7f\r\n"
            "Date: Thu, 01 Jan 2026 00:00:00 GMT\r\nContent-Length: %d\r\n\r\n")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_PATCH(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status = 200 if self.headers.get("Authorization") == f"Bearer {TOKEN}" else 401
            # One write for head and body: two small writes meet the client's delayed ACK
            # (Nagle), 40 ms per request.
            self.wfile.write((head % (status, len(body))).encode() + body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if cert_dir is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(os.path.join(cert_dir, "server.crt"),
                                os.path.join(cert_dir, "server.key"))
        server.socket = context.wrap_socket(server.socket, server_side=True)
    print(server.server_address[1], flush=True)
    server.serve_forever()  # until the benchmark terminates this process


def make_certificates(directory: str) -> None:
    """A throwaway CA and a server certificate for 127.0.0.1 (openssl, EC P-256)."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ca_key, ca_crt = os.path.join(directory, "ca.key"), os.path.join(directory, "ca.crt")
    key, csr = os.path.join(directory, "server.key"), os.path.join(directory, "server.csr")
    extensions = os.path.join(directory, "server.ext")
    with open(extensions, "w") as file:
        file.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *curve, "-keyout", ca_key, "-out", ca_crt, "-days", "1",
            "-subj", "/CN=rest-cost-ca")
    openssl("req", *curve, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1")
    openssl("x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial",
            "-out", os.path.join(directory, "server.crt"), "-days", "1",
            "-extfile", extensions)


def kubernetes_client(url: str, ca_file: str | None) -> k8s.ApiClient:
    """The kubernetes package's ApiClient, with the Retry policy our client has."""
    configuration = k8s.Configuration(host=url)
    configuration.api_key = {"BearerToken": TOKEN}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    configuration.proxy = None
    configuration.ssl_ca_cert = ca_file
    configuration.retries = new_retry(3)
    configuration.connection_pool_maxsize = 4
    return k8s.ApiClient(configuration)


def our_client(url: str, ca_file: str | None) -> HttpClient:
    return new_api_client(ClientConfig(url, credentials=bearer(TOKEN), ca_file=ca_file),
                          pool_maxsize=4)


def client_path(api_client: k8s.ApiClient) -> Callable[[], dict[str, Any]]:
    """One merge-patch the kubernetes client's way, as RestClient used to send it."""
    path = WIDGETS.path("ns", "w", "status")

    def send() -> dict[str, Any]:
        _, url, headers, _, _ = api_client.param_serialize(
            method="PATCH", resource_path=path,
            header_params={"Accept": "application/json", "Content-Type": MERGE_PATCH},
            auth_settings=["BearerToken"])
        response = api_client.call_api("PATCH", url, header_params=headers, body=STATUS_PATCH,
                                       _request_timeout=30.0).response
        try:
            data = response.read()
        finally:
            response.release_conn()
        if response.status != 200:
            raise RuntimeError(f"status {response.status}")
        decoded: dict[str, Any] = json.loads(data)
        return decoded

    return send


def rest_path(rest: RestClient) -> Callable[[], dict[str, Any]]:
    def send() -> dict[str, Any]:
        return rest.patch(WIDGETS, "w", STATUS_PATCH, namespace="ns", subresource="status")

    return send


def cpu_per_request(send: Callable[[], dict[str, Any]], count: int) -> float:
    """CPU microseconds of this thread per request, over ``count`` requests."""
    started = time.thread_time()
    for _ in range(count):
        send()
    return (time.thread_time() - started) / count * 1e6


def measure(url: str, ca_file: str | None, *, n: int, batches: int) -> None:
    old_client, lean_client = kubernetes_client(url, ca_file), our_client(url, ca_file)
    paths = {"a) ApiClient.param_serialize+call_api": client_path(old_client),
             "b) RestClient.patch": rest_path(RestClient(lean_client, qps=1e9, burst=10**9))}
    for send in paths.values():  # warm up: connections, caches, first-call imports
        for _ in range(200):
            send()
    per_batch = max(1, n // batches)
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(batches):  # alternating, so drift of the machine hits both alike
        for name, send in paths.items():
            samples[name].append(cpu_per_request(send, per_batch))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    scheme = url.split(":", maxsplit=1)[0]
    print(f"{per_batch * batches} merge-patches per path over {scheme}, {batches} batches, "
          f"{len(answer_object())} B answers; client thread CPU per request:")
    for name, values in samples.items():
        shown = " ".join(f"{v:.0f}" for v in values)
        print(f"  {name:40s} median {medians[name]:6.1f} us   (batches: {shown})")
    old, new = medians.values()
    print(f"  ratio old/new: {old / new:.2f}x   (the new path uses {100 * (1 - new / old):.0f}%"
          " less CPU)")
    old_client.close()  # type: ignore[no-untyped-call]
    lean_client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="requests per path (default 2000)")
    parser.add_argument("--batches", type=int, default=5, help="batches per path (default 5)")
    parser.add_argument("--tls", action="store_true",
                        help="HTTPS with a throwaway CA (needs openssl), as to a real apiserver")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cert-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.cert_dir)
        return
    with tempfile.TemporaryDirectory(prefix="rest-cost-") as directory:
        command = [sys.executable, __file__, "--serve"]
        if args.tls:
            make_certificates(directory)
            command += ["--cert-dir", directory]
        server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            scheme = "https" if args.tls else "http"
            measure(f"{scheme}://127.0.0.1:{port}",
                    os.path.join(directory, "ca.crt") if args.tls else None,
                    n=args.n, batches=args.batches)
        finally:
            server.terminate()
            server.wait(timeout=10)


if __name__ == "__main__":
    main()
