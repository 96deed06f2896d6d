"""hack/prometheus/scrape_config.py: the Prometheus check's scrape config, read from deploy/.

The ServiceMonitor is translated field by field; a field the translation does not know must
stop it (a silently dropped field would make the check scrape what no Prometheus Operator
would), and the translation must read the file it is given, not a copy.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "prometheus" / "scrape_config.py"


def _run(deploy: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--deploy", str(deploy)],
                          capture_output=True, text=True, timeout=60, check=False)


def _copy_deploy(tmp_path: Path, edit: Any) -> Path:
    deploy = tmp_path / "deploy"
    shutil.copytree(REPO / "deploy", deploy)
    path = deploy / "prometheus" / "servicemonitor.yaml"
    monitor = yaml.safe_load(path.read_text(encoding="utf-8"))
    edit(monitor)
    path.write_text(yaml.safe_dump(monitor), encoding="utf-8")
    return deploy


def _jobs(text: str) -> dict[str, dict[str, Any]]:
    return {job["job_name"]: job for job in yaml.safe_load(text)["scrape_configs"]}


def test_the_shipped_service_monitor_becomes_one_endpointslice_job() -> None:
    result = _run(REPO / "deploy")
    assert result.returncode == 0, result.stderr
    jobs = _jobs(result.stdout)
    assert set(jobs) == {"kubernetes-pods", "kubernetes-service-endpoints",
                         "serviceMonitor/himitsu-system/himitsu-operator/0"}
    monitor = jobs["serviceMonitor/himitsu-system/himitsu-operator/0"]
    assert monitor["kubernetes_sd_configs"] == [
        {"role": "endpointslice", "namespaces": {"names": ["himitsu-system"]}}]
    assert (monitor["metrics_path"], monitor["scheme"], monitor["scrape_interval"]) == (
        "/metrics", "http", "30s")


def test_the_translation_reads_the_file_it_is_given(tmp_path: Path) -> None:
    def rename_port(monitor: dict[str, Any]) -> None:
        monitor["spec"]["endpoints"][0]["port"] = "renamed"

    result = _run(_copy_deploy(tmp_path, rename_port))
    assert result.returncode == 0, result.stderr
    job = _jobs(result.stdout)["serviceMonitor/himitsu-system/himitsu-operator/0"]
    port_keep = [r for r in job["relabel_configs"]
                 if r.get("source_labels") == ["__meta_kubernetes_endpointslice_port_name"]]
    assert port_keep == [{"action": "keep", "regex": "renamed",
                          "source_labels": ["__meta_kubernetes_endpointslice_port_name"]}]


def test_a_service_monitor_field_it_does_not_implement_stops_it(tmp_path: Path) -> None:
    def add_relabelings(monitor: dict[str, Any]) -> None:
        monitor["spec"]["endpoints"][0]["relabelings"] = [
            {"action": "drop", "sourceLabels": ["pod"]}]

    result = _run(_copy_deploy(tmp_path, add_relabelings))
    assert result.returncode != 0
    assert "spec.endpoints[0]" in result.stderr and "relabelings" in result.stderr
