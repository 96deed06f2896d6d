"""The memory scenario: the operator's RSS after a cold sync of N HimitsuSecrets, the
cost per object, and the imports alone; optionally a baseline source tree beside it.

What one run is: no operator runs; the fleet's target Secrets are deleted; a fresh
operator process starts against the N HimitsuSecrets and syncs every one of them (reads
Himitsu, creates each Secret, patches each status); once it has created all N Secrets
and its queue is empty and no worker is busy, ``VmRSS`` and ``VmHWM`` (peak) are read
from /proc. Every run of every size and tree does exactly that work, whatever ran before,
so a baseline tree measured in the same run (``--baseline-src``) is compared like for
like; runs of the two trees alternate. The fleet grows between sizes while no operator
runs (1,000 -> 5,000 -> 10,000: the objects are created once, not per size).

Why refreshInterval 1h: nothing falls due after the sync, so RSS is read on a quiet
process; why all Owner: resetting a run is then one delete-collection per namespace.
The fleet layout is otherwise the bench's (50 namespaces, 20 environments, 20 keys).

The slope is a least-squares line through every run's RSS against N: MiB per 1,000
HimitsuSecrets, its intercept being the fixed cost at 0. The imports alone: a Python
process importing every module of the operator's package and starting nothing.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import figures
from .auditlog import AuditGap
from .kubeapi import secret_path
from .measure import snapshot, wait_for, window
from .procs import REPO
from .report import Row, Target
from .rig import Fleet, Rig
from .scenarios import RSS_TARGET, Result, snapshot_at_start

TAG = "mem"
REFRESH = "1h"
SETTLE = 2.0  # seconds between a quiet queue and the RSS reading
IMPORT_RUNS = 3
# Every module of the package, nothing started; VmRSS of this very process.
IMPORTS_SCRIPT = """
import importlib, json, pkgutil
import himitsu_controller
for info in pkgutil.walk_packages(himitsu_controller.__path__, "himitsu_controller."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
with open("/proc/self/status") as fh:
    status = fh.read()
print(json.dumps({"file": himitsu_controller.__file__, "status": status}))
"""


@dataclass(frozen=True)
class Tree:
    """A source tree whose ``himitsu_controller`` package the operator runs."""

    label: str
    src: Path


def trees(baseline: Path | None) -> list[Tree]:
    this = Tree("this tree", REPO / "src")
    if baseline is None:
        return [this]
    src = baseline.resolve()
    if not (src / "himitsu_controller" / "__init__.py").is_file():
        raise SystemExit(f"--baseline-src {baseline}: no himitsu_controller package in it "
                         f"(give the tree's src/ directory)")
    return [Tree("baseline", src), this]


def imports_rss(tree: Tree, python: Path) -> dict[str, Any]:
    """VmRSS of a process that imported the operator's modules: median of a few runs."""
    rss: list[float] = []
    for _ in range(IMPORT_RUNS):
        out = subprocess.run([str(python), "-c", IMPORTS_SCRIPT], check=True,
                             capture_output=True, text=True, cwd="/",
                             env={"PYTHONPATH": str(tree.src), "PATH": "/usr/bin:/bin"})
        info = json.loads(out.stdout)
        if not str(info["file"]).startswith(str(tree.src)):
            raise RuntimeError(f"{tree.label}: imported {info['file']}, not from {tree.src}")
        rss.append(figures.mib(figures.status_kib(info["status"], "VmRSS")))
    return {"rss": figures.median(rss), "runs": rss}


def grow(rig: Rig, fleet: Fleet | None, size: int) -> tuple[Fleet, dict[str, float]]:
    """The fleet at ``size`` members (no operator runs): creates only the new ones."""
    bigger = rig.prepare_fleet(TAG, size, refresh=REFRESH, envs=rig.envs, merge_every=0)
    have = len(fleet.members) if fleet is not None else 0
    new = bigger.members[have:]
    seconds = rig.create_hsecs(bigger, new) if new else 0.0
    return bigger, {"created": float(len(new)), "seconds": seconds,
                    "per_second": len(new) / seconds if seconds > 0 else 0.0}


def reset_targets(rig: Rig, fleet: Fleet) -> None:
    """Delete every target Secret of the fleet (one delete-collection per namespace)."""
    selector = "himitsu.io/managed=true"
    rig.parallel(lambda ns: rig.kube.request(
        "DELETE", secret_path(ns), params={"labelSelector": selector}), fleet.namespaces)
    left = [ns for ns in fleet.namespaces
            if rig.kube.get(secret_path(ns), labelSelector=selector, limit=1)["items"]]
    if left:
        raise RuntimeError(f"target Secrets still present in {left[:3]} after deleting them")


def _metric(rig: Rig, name: str, **match: str) -> float:
    return figures.metric_sum(rig.op.metrics(), name, **match)


def _quiet(rig: Rig) -> bool:
    samples = rig.op.metrics()
    return (figures.metric_sum(samples, "workqueue_depth") == 0
            and figures.metric_sum(samples, "controller_runtime_active_workers") == 0)


def _settled(rig: Rig) -> bool:
    """Quiet twice, a second apart: a status patch may be between queue and worker."""
    if not _quiet(rig):
        return False
    time.sleep(1.0)
    return _quiet(rig)


def one_run(rig: Rig, fleet: Fleet, tree: Tree) -> dict[str, Any]:
    """Reset the targets, start a fresh operator of ``tree``, wait until it has created
    every Secret and is idle; its memory then."""
    size = len(fleet.members)
    rig.stop_operator()
    reset_targets(rig, fleet)
    op = rig.start_operator(src=tree.src)
    began = op.child.started_wall
    timeout = max(600.0, size * 0.2)
    every = max(1.0, size / 2000)  # its /metrics grows with N (a series per object)
    if not wait_for(lambda: _metric(rig, "himitsu_secret_writes_total", operation="create")
                    >= size, timeout=timeout, interval=every):
        raise TimeoutError(f"memory {size} ({tree.label}): not every Secret created in "
                           f"{timeout:.0f} s")
    synced = time.time() - began
    # Each created Secret's event queues its owner once more (a second status look):
    # at N = 5,000 that tail alone outlasts a fixed few minutes on a loaded machine.
    if not wait_for(lambda: _settled(rig), timeout=max(180.0, size * 0.2), interval=every):
        raise TimeoutError(f"memory {size} ({tree.label}): the queue did not drain")
    idle = time.time() - began
    time.sleep(SETTLE)
    memory = op.memory_mib()
    win = window(rig, snapshot_at_start(began), snapshot(rig))
    if win.kube_total == 0:  # it created every Secret: the log cannot be empty
        raise AuditGap(f"memory {size} ({tree.label}): {size} Secrets created, yet no "
                       f"request of the operator in the audit log")
    rig.log(f"  memory {size} ({tree.label}): written {synced:.1f} s, idle {idle:.1f} s "
            f"after start; "
            f"rss {memory['rss']:.1f} MiB, peak {memory['peak_rss']:.1f} MiB")
    return {"rss": memory["rss"], "peak_rss": memory["peak_rss"], "synced_seconds": synced,
            "idle_seconds": idle,
            "kube_per_object": win.kube_total / size, "cpu_seconds": win.cpu_ms / 1000.0,
            "kube_requests": dict(win.kube), "src": str(tree.src)}


def control_plane_mib(rig: Rig) -> dict[str, float]:
    """RSS of etcd and kube-apiserver now (how the local control plane copes)."""
    out: dict[str, float] = {}
    for name in ("etcd", "kube-apiserver"):
        proc = rig.cluster.processes.get(name)
        if proc is None or proc.pid is None:
            continue
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except OSError:
            continue
        out[name] = figures.mib(figures.status_kib(status, "VmRSS"))
    return out


def memory(rig: Rig, *, sizes: list[int], repeat: int, repeat_upto: int,
           tree_list: list[Tree]) -> Result:
    """Every size ascending; ``repeat`` runs per tree at sizes up to ``repeat_upto``."""
    rig.stop_operator()
    data: dict[str, Any] = {
        "refresh": REFRESH, "trees": {t.label: str(t.src) for t in tree_list},
        "imports": {t.label: imports_rss(t, rig.operator_python) for t in tree_list},
        "operator_python": str(rig.operator_python),
        "runs": {t.label: {} for t in tree_list}, "growth": {}, "control_plane_mib": {}}
    fleet: Fleet | None = None
    for size in sorted(set(sizes)):
        fleet, growth = grow(rig, fleet, size)
        data["growth"][size] = growth
        rig.log(f"memory: fleet at {size} (+{growth['created']:.0f} HimitsuSecrets in "
                f"{growth['seconds']:.0f} s, {growth['per_second']:.0f}/s)")
        for _ in range(repeat if size <= repeat_upto else 1):
            for tree in tree_list:
                data["runs"][tree.label].setdefault(size, []).append(
                    one_run(rig, fleet, tree))
        data["control_plane_mib"][size] = control_plane_mib(rig)
    rig.stop_operator()
    return memory_rows(data), data


def memory_rows(data: dict[str, Any]) -> list[Row]:
    """The table: per size RSS (target, verdict), peak, sync time; the slope; the imports;
    with a baseline, its figures and the ratio."""
    labels = list(data["trees"])
    this = labels[-1]
    base = labels[0] if len(labels) > 1 else None
    rows: list[Row] = []

    def med(label: str, size: int, key: str) -> float:
        return figures.median([float(r[key]) for r in data["runs"][label][size]])

    for size in sorted(data["runs"][this]):
        runs = data["runs"][this][size]
        label = f"memory {size}"
        plane = data["control_plane_mib"].get(size, {})
        growth = data["growth"].get(size, {})
        target = RSS_TARGET.get(size)
        rows.append(Row(label, "RSS after a cold sync", med(this, size, "rss"), "MiB", 0,
                        Target("<=", target) if target else None,
                        f"median of {len(runs)}; 20 keys each; VmRSS once idle"))
        rows.append(Row(label, "peak RSS (VmHWM)", med(this, size, "peak_rss"), "MiB", 0))
        rows.append(Row(label, "seconds until every Secret written",
                        med(this, size, "synced_seconds"), "s", 1,
                        note=f"from process start; idle after {med(this, size, 'idle_seconds'):.0f}"
                             f" s; kube requests per HimitsuSecret "
                             f"{med(this, size, 'kube_per_object'):.2f}"))
        if base is not None:
            b_rss = med(base, size, "rss")
            rows.append(Row(label, "RSS after a cold sync, baseline", b_rss, "MiB", 0,
                            note=f"peak {med(base, size, 'peak_rss'):.0f} MiB; written in "
                                 f"{med(base, size, 'synced_seconds'):.1f} s"))
            rows.append(Row(label, "RSS ratio (this tree / baseline)",
                            med(this, size, "rss") / b_rss, "", 2))
        rows.append(Row(label, "control plane RSS (etcd, apiserver)",
                        sum(plane.values()) if plane else None, "MiB", 0,
                        note=", ".join(f"{k} {v:.0f}" for k, v in plane.items())
                        + (f"; +{growth['created']:.0f} created at {growth['per_second']:.0f}/s"
                           if growth.get("created") else "")))
    for label_ in [this] + ([base] if base else []):
        points = [(float(size), float(r["rss"])) for size, runs in data["runs"][label_].items()
                  for r in runs]
        fit = figures.linear_fit(points)
        suffix = "" if label_ == this else ", baseline"
        rows.append(Row("memory slope", f"MiB per 1,000 HimitsuSecrets{suffix}",
                        fit[0] * 1000 if fit else None, "MiB", 1,
                        note=f"least squares over {len(points)} runs; intercept "
                             f"{fit[1]:.0f} MiB" if fit else "needs two sizes"))
    for label_ in [this] + ([base] if base else []):
        imports = data["imports"][label_]
        suffix = "" if label_ == this else ", baseline"
        rows.append(Row("memory imports", f"RSS of the imports alone{suffix}", imports["rss"],
                        "MiB", 0, note=f"every module imported, nothing started; median of "
                                       f"{len(imports['runs'])}"))
    return rows
