"""Copy deploy/'s sources into charts/himitsu-controller (`make chart-sync`), or check them.

The chart cannot read files outside its own folder, so the CRD, the role files its
rules come from, and the PrometheusRule and Grafana dashboard (when deploy/ has them)
are copied in, byte for byte. deploy/ is the one source: edit there, then run this.
``--check`` changes nothing and exits 1 naming every copy that differs or is missing
(`make lint` and tests/unit/test_chart.py run it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "himitsu-controller"

# deploy/ source -> chart copy; optional sources (another team's files) may be absent.
COPIES: dict[str, str] = {
    "deploy/crd/himitsu.io_himitsusecrets.yaml": "crds/himitsu.io_himitsusecrets.yaml",
    "deploy/rbac/role.yaml": "files/rbac/role.yaml",
    "deploy/rbac/leader_election_role.yaml": "files/rbac/leader_election_role.yaml",
    "deploy/rbac/aggregate/himitsu_view.yaml": "files/rbac/himitsu_view.yaml",
    "deploy/rbac/aggregate/himitsu_edit.yaml": "files/rbac/himitsu_edit.yaml",
    "deploy/components/rollout-restarts/role.yaml": "files/rbac/rollout_restart_role.yaml",
    "deploy/components/metrics-secure/metrics_auth_role.yaml": "files/rbac/metrics_auth_role.yaml",
    "deploy/components/metrics-secure/metrics_reader_role.yaml":
        "files/rbac/metrics_reader_role.yaml",
}
OPTIONAL: dict[str, str] = {
    "deploy/prometheus/prometheusrule.yaml": "files/prometheusrule.yaml",
    "deploy/grafana/himitsu-controller.json": "files/grafana-dashboard.json",
}


def pairs(root: Path = ROOT) -> list[tuple[Path, Path, bool]]:
    """(source, copy, required) for every copy the chart holds or should hold."""
    chart = root / "charts" / "himitsu-controller"
    return ([(root / s, chart / c, True) for s, c in COPIES.items()]
            + [(root / s, chart / c, False) for s, c in OPTIONAL.items()])


def differences(root: Path = ROOT) -> list[str]:
    """What `sync` would change; empty when the chart is in step with deploy/."""
    found = []
    for source, copy, required in pairs(root):
        if not source.exists():
            if required:
                found.append(f"{source.relative_to(root)} is missing")
            elif copy.exists():
                found.append(f"{copy.relative_to(root)} has no source any more")
        elif not copy.exists() or copy.read_bytes() != source.read_bytes():
            found.append(f"{copy.relative_to(root)} differs from {source.relative_to(root)}")
    return found


def sync(root: Path = ROOT) -> list[str]:
    changed = []
    for source, copy, _ in pairs(root):
        if source.exists():
            if not copy.exists() or copy.read_bytes() != source.read_bytes():
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.write_bytes(source.read_bytes())
                changed.append(str(copy.relative_to(root)))
        elif copy.exists():
            copy.unlink()
            changed.append(f"{copy.relative_to(root)} (removed)")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if out of step")
    args = parser.parse_args(argv)
    if args.check:
        found = differences()
        for line in found:
            print(f"chart-sync: {line}", file=sys.stderr)
        if found:
            print("chart-sync: run `make chart-sync` (deploy/ is the source)", file=sys.stderr)
        return 1 if found else 0
    for line in sync():
        print(f"chart-sync: wrote {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
