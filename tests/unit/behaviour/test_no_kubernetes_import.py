"""The operator's process never imports the ``kubernetes`` package in a cluster.

Why it matters: importing ``kubernetes.client`` alone takes a process from ~26 MiB to
~42 MiB resident, a third of the operator's memory floor (issue 15's RSS targets), and
the image does not carry it (an optional extra, for out-of-cluster kubeconfigs only). A
fresh interpreter runs the real CLI wiring with the in-cluster configuration (service
host and port, the ServiceAccount's token and CA files; the three clients built, leader
election, informers, a reconcile and its Event sent) against the fake apiserver on TLS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tls_server import make_pki

HERE = Path(__file__).parents[1] / "support"

SCRIPT = """
import json, os, ssl, sys, threading, time
sys.path.insert(0, sys.argv[1])
from fake_apiserver import TOKEN, Canned, FakeApiServer
from himitsu_controller import api, cli
from himitsu_controller.runtime.client import config
pki = json.loads(sys.argv[2])

class Server(FakeApiServer):
    def _get(self, path):
        if not path.endswith("/" + api.PLURAL):
            return super()._get(path)
        broken = {"metadata": {"namespace": "apps", "name": "broken", "uid": "u-1",
                               "resourceVersion": "10", "generation": 1},
                  "spec": {"target": {"name": "app-secrets"}}}
        return Canned(200, {"kind": api.KIND + "List", "apiVersion": api.API_VERSION,
                            "metadata": {"resourceVersion": "10"}, "items": [broken]})

tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
tls.load_cert_chain(pki["cert"], pki["key"])
server = Server(list_kind="SecretList", api_version="v1", tls=tls).start()
with open(pki["token"], "w") as token:
    token.write(TOKEN)
config.SERVICE_ACCOUNT_TOKEN_PATH, config.SERVICE_ACCOUNT_CA_PATH = pki["token"], pki["ca"]
os.environ["KUBERNETES_SERVICE_HOST"] = "127.0.0.1"
os.environ["KUBERNETES_SERVICE_PORT"] = server.url.rsplit(":", 1)[1]
args = cli.build_parser().parse_args([
    "--leader-elect", "--leader-election-namespace", "default",
    "--metrics-bind-address", "127.0.0.1:0",
    "--health-probe-bind-address", "127.0.0.1:0", "--log-level", "warning",
    "--graceful-shutdown-timeout", "5s"])
stop = threading.Event()
runner = threading.Thread(target=lambda: cli.run(args, stop=stop), daemon=True)
runner.start()
deadline = time.monotonic() + 60
events = lambda: [r for r in server.requests_of("POST") if r.path.endswith("/events")]
while not events() and runner.is_alive() and time.monotonic() < deadline:
    stop.wait(0.02)
served = bool(events())
stop.set()
runner.join(30)
server.stop()
print(json.dumps({"served": served, "host": config.load_client_config().host,
                  "kubernetes": sorted(m for m in sys.modules
                                       if m == "kubernetes" or m.startswith("kubernetes."))}))
"""


@pytest.mark.timeout(120)
def test_running_the_operator_in_a_cluster_does_not_import_kubernetes(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, server_names="IP:127.0.0.1")
    files = {"cert": str(pki.server_cert), "key": str(pki.server_key), "ca": str(pki.ca),
             "token": str(tmp_path / "token")}
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config: the in-cluster configuration or none
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(HERE), json.dumps(files)],
                          capture_output=True, text=True, timeout=100, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["served"], "the operator never reconciled: " + done.stderr[-2000:]
    assert outcome["host"].startswith("https://127.0.0.1:")  # the in-cluster configuration
    assert outcome["kubernetes"] == []
