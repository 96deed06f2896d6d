"""A real Prometheus for the suite: its HTTP API, a host process, and what it must see.

Why a real one and not the text parser: Prometheus negotiates the exposition format
(OpenMetrics first), discovers targets from what deploy/ ships and keeps series apart per
target; only a real server shows that a dashboard query would work. ``check_two_replicas``
is the one statement both variants assert: each replica of one job is ``up``,
``controller_runtime_reconcile_total`` grows between scrapes, and
``leader_election_master_status`` sums to exactly one leader.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from .kubehelp import wait_for
from .operator_proc import free_port

Vector = dict[str, float]


class PrometheusApi:
    """Instant queries against /api/v1, each bounded by a timeout."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def ready(self) -> bool:
        try:
            return requests.get(f"{self.url}/-/ready", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        response = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        response.raise_for_status()
        body = response.json()
        if body.get("status") != "success" or body["data"]["resultType"] != "vector":
            raise AssertionError(f"query {expr!r}: {body}")
        return [(dict(s["metric"]), float(s["value"][1])) for s in body["data"]["result"]]

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule: name, health ("ok", "err", "unknown"), lastError, ..."""
        response = requests.get(f"{self.url}/api/v1/rules", timeout=10)
        response.raise_for_status()
        return [rule for group in response.json()["data"]["groups"] for rule in group["rules"]]

    def by(self, label: str, expr: str) -> Vector:
        """``expr``'s samples keyed by one label (each key at most once)."""
        result: Vector = {}
        for metric, value in self.query(expr):
            key = metric.get(label, "")
            if key in result:
                raise AssertionError(f"{expr!r}: two series with {label}={key!r}")
            result[key] = value
        return result

    def targets(self, job: str) -> list[dict[str, Any]]:
        """The job's active targets: labels, health and last error (for failure messages)."""
        try:
            response = requests.get(f"{self.url}/api/v1/targets", params={"state": "active"},
                                    timeout=10)
            active = response.json()["data"]["activeTargets"]
        except (requests.RequestException, ValueError, KeyError) as exc:
            return [{"error": repr(exc)}]
        return [{"labels": t.get("labels"), "health": t.get("health"),
                 "lastError": t.get("lastError")}
                for t in active if t.get("scrapePool") == job
                or (t.get("labels") or {}).get("job") == job]


def check_two_replicas(prom: PrometheusApi, jobs: dict[str, float], label: str,
                       replicas: set[str], *, where: str = "") -> None:
    """Each job of ``jobs`` (name: scrape interval in seconds) scrapes exactly ``replicas``
    (values of ``label``): every one up, exactly one leader, reconciles counted up.

    ``where`` narrows every query (``namespace="..."``: a job may scrape other pods too).
    The jobs are checked phase by phase, so their waits overlap; each wait allows a few
    scrape intervals of its job.
    """
    def expr(metric: str, job: str) -> str:
        return f"{metric}{{{','.join(filter(None, (f'job={job!r}', where)))}}}"

    def wait(job: str, query: str, accept: Callable[[Vector], bool], what: str) -> Vector:
        seen: list[Vector] = []

        def check() -> Vector | None:
            seen[:] = [prom.by(label, query)]
            return seen[0] if accept(seen[0]) else None
        try:
            return wait_for(check, timeout=30 + 4 * jobs[job], what=f"{query}: {what}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nlast answer: {seen}\n"
                                 f"targets of {job}: {prom.targets(job)}") from None

    names = sorted(replicas)
    for job in jobs:
        wait(job, expr("up", job), lambda v: v == dict.fromkeys(replicas, 1.0),
             f"1 for each of {names} and no other series")
    for job in jobs:
        wait(job, expr("leader_election_master_status", job),
             lambda v: set(v) == replicas and sum(v.values()) == 1,
             f"reported by each of {names}, summing to 1")
    counted = {job: f"sum by ({label}) ({expr('controller_runtime_reconcile_total', job)})"
               for job in jobs}
    first = {job: wait(job, query, bool, "scraped") for job, query in counted.items()}
    def above(before: Vector) -> Callable[[Vector], bool]:
        return lambda now: any(now.get(r, 0.0) > n for r, n in before.items())

    for job, query in counted.items():
        wait(job, query, above(first[job]),
             f"above its first scrape {first[job]}: a later scrape counted more reconciles")


class HostPrometheus:
    """``prometheus`` from PATH on 127.0.0.1 with a given config, stopped by its PID."""

    def __init__(self, config: str, workdir: Path) -> None:
        binary = shutil.which("prometheus")
        assert binary, "no prometheus on PATH"
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(config, encoding="utf-8")
        self.port = free_port()
        self.log_path = workdir / "prometheus.log"
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [binary, f"--config.file={workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.api = PrometheusApi(f"http://127.0.0.1:{self.port}")
        try:
            wait_for(self._ready, timeout=60, what="host Prometheus /-/ready")
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        if self._proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self._proc.returncode}:\n"
                                 f"{self.log_path.read_text(errors='replace')[-2000:]}")
        return self.api.ready()

    def stop(self) -> None:
        if self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self._proc.pid, signal.SIGKILL)
                self._proc.wait(timeout=10)
