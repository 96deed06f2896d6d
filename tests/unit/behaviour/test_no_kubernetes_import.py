"""The operator's process never imports the ``kubernetes`` package on its normal paths.

Why it matters: importing ``kubernetes.client`` alone takes a process from ~26 MiB to
~42 MiB resident, a third of the operator's memory floor (issue 15's RSS targets). The
package stays a dependency for the legacy auth-provider/username-password fallback
(runtime/client/legacyauth.py) and the tests' helpers; this test keeps it off everything else:
a fresh interpreter runs the real CLI wiring (kubeconfig loaded, the three clients built,
leader election, informers, a reconcile and its Event sent) against the fake apiserver.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parents[1] / "support"

SCRIPT = """
import json, sys, threading, time
sys.path.insert(0, sys.argv[1])
from fake_apiserver import Canned, FakeApiServer, kubeconfig_for
from himitsu_controller import api, cli

class Server(FakeApiServer):
    def _get(self, path):
        if not path.endswith("/" + api.PLURAL):
            return super()._get(path)
        broken = {"metadata": {"namespace": "apps", "name": "broken", "uid": "u-1",
                               "resourceVersion": "10", "generation": 1},
                  "spec": {"target": {"name": "app-secrets"}}}
        return Canned(200, {"kind": api.KIND + "List", "apiVersion": api.API_VERSION,
                            "metadata": {"resourceVersion": "10"}, "items": [broken]})

server = Server(list_kind="SecretList", api_version="v1").start()
args = cli.build_parser().parse_args([
    "--kubeconfig", str(kubeconfig_for(server, __import__("pathlib").Path(sys.argv[2]))),
    "--leader-elect", "--metrics-bind-address", "127.0.0.1:0",
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
print(json.dumps({"served": served,
                  "kubernetes": sorted(m for m in sys.modules
                                       if m == "kubernetes" or m.startswith("kubernetes."))}))
"""


@pytest.mark.timeout(120)
def test_running_the_operator_does_not_import_kubernetes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(HERE), str(tmp_path / "kc")],
                          capture_output=True, text=True, timeout=100, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["served"], "the operator never reconciled: " + done.stderr[-2000:]
    assert outcome["kubernetes"] == []
