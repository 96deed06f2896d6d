#!/usr/bin/env python3
"""`make demo`: the operator syncing a Himitsu environment into a Secret, on your machine.

Why a script and not a README recipe: a demo that takes ten copy-pasted commands is a
demo nobody runs. `make demo` starts the local control plane (`make cluster-up`), then
this script starts the Himitsu stand-in (seeded with a demo environment and token),
installs the CRD and RBAC, creates namespace `demo` with the token Secret and the
KeyValue sample pointed at the stand-in, starts the operator, waits until the
HimitsuSecret is Ready and shows the result. `down` stops what `up` started.

Everything it starts runs in the background with its PID (and start time, so a recycled
PID is never signalled) in `<dir>/demo.json` and its log in `<dir>/*.log`; `up` is
idempotent (what is already running is kept) and `down` stops by PID only.

    .venv/bin/python hack/demo.py up --dir .local
    .venv/bin/python hack/demo.py down --dir .local
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "deploy" / "samples" / "himitsusecret.yaml"
CRD = REPO / "deploy" / "crd" / "himitsu.io_himitsusecrets.yaml"
RBAC = REPO / "deploy" / "rbac"
NAMESPACE = "demo"
HSEC = "app-config"
PROJECT = "11111111-1111-4111-8111-111111111111"
ENVIRONMENT = "22222222-2222-4222-8222-222222222222"
DEMO_SECRETS = {  # demo values, shown on screen: never put real secrets here
    "DATABASE_URL": "postgres://app:demo-password@db.demo.svc:5432/app",
    "API_KEY": "demo-api-key-0123456789",
    "FEATURE_FLAGS": "checkout-v2,dark-mode",
    "LOG_LEVEL": "info",
}
STATE_FILE = "demo.json"
READY_TIMEOUT = 90.0


class DemoError(Exception):
    """Something the user must see: a one-line reason and, when useful, a log tail."""


# -- processes by PID ---------------------------------------------------------------------
def _start_time(pid: int) -> str | None:
    """The start time of a live process, or None: a bare PID can be recycled."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _alive(record: dict[str, Any] | None) -> bool:
    if not record:
        return False
    return _start_time(int(record["pid"])) == str(record["start"])


def _spawn(argv: list[str], log: Path) -> dict[str, Any]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    return {"pid": proc.pid, "start": _start_time(proc.pid), "log": str(log)}


def _stop(name: str, record: dict[str, Any] | None) -> None:
    if record is None or not _alive(record):
        return
    pid = int(record["pid"])
    os.kill(pid, signal.SIGTERM)
    if not _wait(lambda: not _alive(record), 40.0):
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: not _alive(record), 10.0)
    print(f"stopped {name} (pid {pid})")


def _wait(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def _tail(path: str | Path, lines: int = 25) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- state ----------------------------------------------------------------------------------
class Demo:
    def __init__(self, workdir: Path) -> None:
        self.dir = workdir.resolve()
        self.kubeconfig = self.dir / "kubeconfig"
        self.state_path = self.dir / STATE_FILE
        self.state: dict[str, Any] = {}
        if self.state_path.exists():
            self.state = json.loads(self.state_path.read_text())

    def save(self) -> None:
        self.state_path.write_text(json.dumps(self.state, indent=2) + "\n")

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        binary = self.dir / "bin" / "kubectl"
        kubectl = str(binary) if binary.exists() else "kubectl"
        result = subprocess.run([kubectl, f"--kubeconfig={self.kubeconfig}", *args],
                                input=stdin, capture_output=True, text=True, check=False)
        if check and result.returncode != 0:
            raise DemoError(f"kubectl {' '.join(args)} failed:\n{result.stderr.strip()}")
        return result.stdout

    def apply(self, *objects: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin="\n---\n".join(json.dumps(o) for o in objects))

    # -- up -------------------------------------------------------------------------------
    def up(self) -> None:
        if not self.kubeconfig.exists():
            raise DemoError(f"no control plane in {self.dir}: run `make cluster-up` first")
        try:
            self.kubectl("get", "--raw", "/readyz")
        except DemoError as exc:
            raise DemoError(f"the control plane in {self.dir} does not answer; start it with "
                            f"`make cluster-up`.\n{exc}") from None
        token = self.start_standin()
        self.install()
        self.create_demo_objects(token)
        self.start_operator()
        self.wait_ready()
        self.show()

    def start_standin(self) -> str:
        tokens_path = self.dir / "standin-tokens.json"
        record = self.state.get("standin")
        if record is not None and _alive(record):
            print(f"the Himitsu stand-in is already running at {record['url']}")
        else:
            seed = {"environments": [{"project": PROJECT, "environment": ENVIRONMENT,
                                      "secrets": DEMO_SECRETS}],
                    "tokens": [{"name": "demo", "project": PROJECT, "environment": ENVIRONMENT}]}
            seed_path = self.dir / "standin-seed.json"
            seed_path.write_text(json.dumps(seed, indent=2) + "\n")
            port_path = self.dir / "standin.port"
            for stale in (port_path, tokens_path):
                stale.unlink(missing_ok=True)
            record = _spawn([sys.executable, str(REPO / "hack" / "himitsu_standin"), "serve",
                             "--port", "0", "--port-file", str(port_path),
                             "--seed-file", str(seed_path), "--tokens-out", str(tokens_path)],
                            self.dir / "standin.log")
            if not _wait(lambda: port_path.exists() or not _alive(record), 30.0) \
                    or not port_path.exists():
                raise DemoError(f"the Himitsu stand-in did not start; last lines of "
                                f"{record['log']}:\n{_tail(record['log'])}")
            record["url"] = f"http://127.0.0.1:{port_path.read_text().strip()}"
            self.state["standin"] = record
            self.save()
            print(f"started the Himitsu stand-in at {record['url']} (pid {record['pid']})")
        return str(json.loads(tokens_path.read_text())["demo"])

    def install(self) -> None:
        self.kubectl("apply", "-f", str(CRD))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                     "crd/himitsusecrets.himitsu.io")
        self.apply({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": "himitsu-system"}})
        self.kubectl("apply", "-k", str(RBAC))

    def create_demo_objects(self, token: str) -> None:
        sample = next(d for d in yaml.safe_load_all(SAMPLES.read_text())
                      if d and d["metadata"]["name"] == HSEC)
        sample["metadata"]["namespace"] = NAMESPACE
        sample["spec"].update({"apiUrl": self.state["standin"]["url"], "projectId": PROJECT,
                               "environmentId": ENVIRONMENT, "refreshInterval": "30s"})
        # stdin, never argv: a token on a command line is visible to every user in `ps`.
        self.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
             "metadata": {"name": "himitsu-token", "namespace": NAMESPACE},
             "data": {"token": base64.b64encode(token.encode()).decode()}},
            sample,
        )

    def start_operator(self) -> None:
        record = self.state.get("operator")
        if record is not None and _alive(record):
            print(f"the operator is already running (pid {record['pid']})")
            return
        metrics, probes = _free_port(), _free_port()
        record = _spawn([sys.executable, "-m", "himitsu_controller",
                         "--kubeconfig", str(self.kubeconfig),
                         "--metrics-bind-address", f"127.0.0.1:{metrics}",
                         "--health-probe-bind-address", f"127.0.0.1:{probes}",
                         # Tokens go to the stand-in and nowhere else; it speaks plain
                         # http on loopback, which production refuses.
                         "--allowed-api-urls", self.state["standin"]["url"],
                         "--allow-insecure-http",
                         "--log-format", "json"], self.dir / "operator.log")
        record.update({"metrics": metrics, "probes": probes})
        self.state["operator"] = record
        self.save()
        print(f"started the operator (pid {record['pid']}, metrics "
              f"http://127.0.0.1:{metrics}/metrics, log {record['log']})")

    def wait_ready(self) -> None:
        operator = self.state["operator"]

        def ready() -> bool:
            if not _alive(operator):
                raise DemoError(f"the operator exited; last lines of {operator['log']}:\n"
                                f"{_tail(operator['log'])}")
            out = self.kubectl("-n", NAMESPACE, "get", "hsec", HSEC, "-o", "json", check=False)
            obj = json.loads(out or "{}")
            status = obj.get("status") or {}
            # A status from before this `up` (an older stand-in URL) does not count.
            current = status.get("observedGeneration") == obj["metadata"]["generation"]
            return current and any(c.get("type") == "Ready" and c.get("status") == "True"
                                   for c in status.get("conditions") or [])

        if not _wait(ready, READY_TIMEOUT):
            status = self.kubectl("-n", NAMESPACE, "get", "hsec", HSEC, "-o",
                                  "jsonpath={.status.conditions}", check=False)
            raise DemoError(f"HimitsuSecret {NAMESPACE}/{HSEC} not Ready after "
                            f"{READY_TIMEOUT:.0f} s; conditions: {status or '(none)'}\n"
                            f"last lines of {operator['log']}:\n{_tail(operator['log'])}")

    def show(self) -> None:
        kubectl = f"KUBECONFIG={self.kubeconfig} {self.dir / 'bin' / 'kubectl'}"
        print(f"\n$ kubectl -n {NAMESPACE} get hsec")
        print(self.kubectl("-n", NAMESPACE, "get", "hsec").rstrip())
        sample = self.kubectl("-n", NAMESPACE, "get", "hsec", HSEC, "-o",
                              "jsonpath={.spec.target.name}")
        secret = json.loads(self.kubectl("-n", NAMESPACE, "get", "secret", sample, "-o", "json"))
        print(f"\nSecret {NAMESPACE}/{sample} (demo values, decoded):")
        for key, value in sorted((secret.get("data") or {}).items()):
            print(f"  {key} = {base64.b64decode(value).decode()}")
        print(f"\nTry it:\n  {kubectl} -n {NAMESPACE} describe hsec {HSEC}\n"
              f"  {kubectl} -n {NAMESPACE} delete secret {sample}   # restored within seconds\n"
              f"  tail -f {self.state['operator']['log']}\n"
              f"Stop everything with `make demo-down`.")

    # -- down -----------------------------------------------------------------------------
    def down(self) -> None:
        _stop("the operator", self.state.pop("operator", None))
        _stop("the Himitsu stand-in", self.state.pop("standin", None))
        if self.state_path.exists():
            self.save()
        print("demo stopped")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("command", choices=("up", "down"))
    parser.add_argument("--dir", default=".local", type=Path,
                        help="the local control plane's directory (default .local)")
    args = parser.parse_args(argv)
    demo = Demo(args.dir)
    try:
        if args.command == "up":
            demo.up()
        else:
            demo.down()
    except DemoError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
