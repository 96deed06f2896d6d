"""``python bench/run.py``: flags, the order scenarios run in, the table and the JSON.

Why one run for every scenario: starting a control plane costs most of a minute, and
the scenarios after the cold sync reuse its last fleet (1,000 HimitsuSecrets) rather
than build it again. Order: cold sync (largest size first, a fresh operator for each
run) -> the fleet switches to the steady refreshInterval -> steady state -> the shared
environment, with drift repair and change propagation measured inside its window (they
touch other namespaces and environments) -> restart, since it replaces the process ->
churn (fleets of its own, created and deleted) -> memory (last: the other fleets are
deleted first, and its largest fleet is left to the teardown).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from . import figures, memory, report, scenarios
from .auditlog import AuditGap
from .measure import ReadyTracker
from .procs import REPO, Profiler, py_spy_path
from .rig import Fleet, Rig

ALL = ("cold", "steady", "shared", "drift", "change", "restart", "churn", "memory")
RESULTS = REPO / "bench" / "results"


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated sizes") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("sizes must be positive")
    return sizes


def _scenarios(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = set(names) - set(ALL)
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"scenarios are among {','.join(ALL)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/run.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Benchmark himitsu-controller on a local control plane with an audit "
                    "log and the Himitsu stand-in; prints a table, writes JSON.")
    p.add_argument("--scenarios", type=_scenarios, default=list(ALL),
                   help=f"comma-separated subset of {','.join(ALL)}")
    p.add_argument("--n", type=int, default=1000,
                   help="fleet size for steady state, drift, change and restart")
    p.add_argument("--cold-sizes", type=_sizes, default=None,
                   help="cold-sync sizes, e.g. 1000,5000 (default: --n)")
    p.add_argument("--repeat", type=int, default=3,
                   help="cold-sync runs per size up to --n (larger sizes run once)")
    p.add_argument("--cold-refresh", default="1m", help="refreshInterval of cold-sync fleets")
    p.add_argument("--refresh", default="10s", help="refreshInterval for steady state, "
                   "drift, change propagation and restart")
    p.add_argument("--duration", type=float, default=120.0, help="steady-state seconds")
    p.add_argument("--windows", type=int, default=4, help="steady-state windows (median)")
    p.add_argument("--warmup", type=float, default=20.0,
                   help="seconds after switching refreshInterval before measuring")
    p.add_argument("--shared-n", type=int, default=200)
    p.add_argument("--shared-duration", type=float, default=180.0,
                   help="seconds the shared environment is measured (scaled to a minute)")
    p.add_argument("--drift-count", type=int, default=100)
    p.add_argument("--drift-pace", type=float, default=0.1,
                   help="seconds between two damaged targets")
    p.add_argument("--changes", type=int, default=5,
                   help="environments changed at once for change propagation")
    p.add_argument("--restart-baseline", type=float, default=30.0)
    p.add_argument("--restart-window", type=float, default=60.0)
    p.add_argument("--churn-n", type=int, default=1000,
                   help="HimitsuSecrets created and deleted per churn round")
    p.add_argument("--churn-rounds", type=int, default=10)
    p.add_argument("--memory-sizes", type=_sizes, default=[1000, 5000],
                   help="memory scenario sizes (1,000: ~25 s a run; 5,000: ~2 min to create "
                        "+ ~90 s a run; 10,000: ~3 min to create + ~3 min a run)")
    p.add_argument("--memory-repeat", type=int, default=3,
                   help="memory runs per tree at sizes up to --n (larger sizes run once)")
    p.add_argument("--baseline-src", type=Path,
                   default=Path(os.environ["BENCH_BASELINE_SRC"])
                   if os.environ.get("BENCH_BASELINE_SRC") else None,
                   help="another tree's src/ (env BENCH_BASELINE_SRC): the steady and memory "
                        "scenarios run its operator too and print both and the ratio")
    p.add_argument("--operator-python", type=Path, default=Path(sys.executable),
                   help="the interpreter that runs the operator (default: this one). `make "
                        "bench` gives a venv of requirements.lock alone, as the image holds: "
                        "dev tools such as rich, which structlog imports when present, "
                        "would add ~5 MiB to every memory figure")
    p.add_argument("--audit-log-maxsize", type=int, default=0, metavar="MB",
                   help="rotate the apiserver's audit log at this size (0: its default, "
                        "100 MB); the reader follows rotations, a small size tests that")
    p.add_argument("--quick", action="store_true",
                   help="small smoke run (100 objects, short windows; a couple of minutes)")
    p.add_argument("--operator-arg", action="append", default=[], metavar="ARG",
                   help="extra operator flag, repeatable (e.g. --operator-arg=--workers=8)")
    p.add_argument("--profile", action="store_true",
                   help="py-spy the operator during cold sync and steady state")
    p.add_argument("--workdir", type=Path, default=None,
                   help="where the cluster and logs live (default: a new temp dir)")
    p.add_argument("--keep-workdir", action="store_true", help="keep it after a clean run")
    p.add_argument("--results-dir", type=Path, default=RESULTS)
    return p


def apply_quick(args: argparse.Namespace) -> None:
    """--quick: every scenario, small and short (explicit flags still win for --n)."""
    if not args.quick:
        return
    args.n = min(args.n, 100)
    args.repeat = 1
    args.duration, args.windows, args.warmup = 30.0, 2, 10.0
    args.shared_n, args.shared_duration = 50, 60.0
    args.drift_count, args.changes = 20, 2
    args.restart_baseline, args.restart_window = 15.0, 30.0
    args.churn_n, args.churn_rounds = min(args.churn_n, 100), 3
    args.memory_sizes, args.memory_repeat = [100, 300], 1


@dataclass
class Run:
    args: argparse.Namespace
    rig: Rig
    rows: list[report.Row] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    fleet: Fleet | None = None

    def wants(self, name: str) -> bool:
        return name in self.args.scenarios

    def add(self, name: str, result: scenarios.Result) -> None:
        rows, data = result
        self.rows.extend(rows)
        self.raw[name] = data
        print(report.format_table(rows), flush=True)


def run_cold(run: Run) -> None:
    args = run.args
    for size in sorted(args.cold_sizes or [args.n], reverse=True):
        reps = args.repeat if size <= args.n else 1
        results = []
        for rep in range(1, reps + 1):
            run.rig.restart_operator()  # cold: no caches, no memory of earlier runs
            profiler = _profiler(run, f"cold-{size}") if rep == reps else None
            fleet, data = scenarios.cold_sync(run.rig, size, rep, refresh=args.cold_refresh)
            if profiler is not None:
                data["profile"] = _finish_profile(profiler)
            results.append(data)
            keep = size == args.n and rep == reps and _needs_fleet(args)
            if keep:
                run.fleet = fleet
            else:
                run.rig.log(f"  deleted in {run.rig.delete_fleet(fleet):.0f} s")
        rows = scenarios.cold_rows(size, results)
        run.add(f"cold_{size}", (rows, {"runs": results}))


def _needs_fleet(args: argparse.Namespace) -> bool:
    return any(s in args.scenarios for s in ("steady", "drift", "change", "restart"))


def ensure_fleet(run: Run) -> Fleet:
    """The fleet of --n HimitsuSecrets, Ready at the steady refreshInterval."""
    rig, args = run.rig, run.args
    if run.fleet is None:
        if rig.operator is None:
            rig.start_operator()
        fleet = rig.prepare_fleet("fleet", args.n, refresh=args.refresh, envs=rig.envs)
        with ReadyTracker(rig, fleet) as tracker:
            rig.create_hsecs(fleet)
            if not tracker.wait(timeout=max(600.0, args.n * 0.5)):
                raise TimeoutError(f"fleet: {len(tracker.ready_at)}/{args.n} Ready")
        run.fleet = fleet
    if run.fleet.refresh != args.refresh:
        took = scenarios.converge(rig, run.fleet, args.refresh)
        rig.log(f"fleet switched to refreshInterval {args.refresh}, Ready in {took:.1f} s")
    return run.fleet


def run_steady(run: Run, fleet: Fleet) -> None:
    """Steady state; with --baseline-src the baseline tree's operator then runs the same
    windows (a fresh process, the same fleet) and the ratios are added."""
    args, rig = run.args, run.rig
    rig.log(f"steady state: {args.duration:.0f} s after {args.warmup:.0f} s warm-up")
    # A fresh process, as the baseline's will be: the one that synced the fleet may still
    # be posting that sync's Events (its recorder queue drains slowly), not steady cost.
    rig.restart_operator()
    profiler = _profiler(run, "steady")
    result = scenarios.steady(rig, fleet, duration=args.duration, windows=args.windows,
                              warmup=args.warmup)
    if profiler is not None:
        result[1]["profile"] = _finish_profile(profiler)
    run.add("steady", result)
    if args.baseline_src is None:
        return
    rig.log(f"steady state, baseline {args.baseline_src}: a fresh operator, same windows")
    rig.stop_operator()
    rig.start_operator(src=args.baseline_src.resolve())
    rows, data = scenarios.steady(rig, fleet, duration=args.duration, windows=args.windows,
                                  warmup=args.warmup, suffix=", baseline")
    rig.restart_operator()  # this tree's again, for what follows
    rows += scenarios.ratio_rows(result[0], rows, limits={
        "operator CPU per poll": 1.10, "kube-apiserver requests per poll": 1.0})
    run.add("steady_baseline", (rows, data))


def run_all(run: Run) -> None:
    args, rig = run.args, run.rig
    if run.wants("cold"):
        run_cold(run)
    if rig.operator is None and set(args.scenarios) - {"memory"}:
        rig.start_operator()
    if _needs_fleet(args):
        ensure_fleet(run)
    assert run.fleet is not None or not _needs_fleet(args)
    if run.wants("steady") and run.fleet is not None:
        run_steady(run, run.fleet)
    shared_since = 0.0
    shared: tuple[Fleet, str] | None = None
    if run.wants("shared"):
        shared = scenarios.shared_fleet(rig, args.shared_n)
        shared_since = time.time()
        rig.log(f"shared environment: {args.shared_n} Ready; measuring "
                f"{args.shared_duration:.0f} s (drift and change run meanwhile)")
    if run.wants("drift") and run.fleet is not None:
        run.add("drift", scenarios.drift(rig, run.fleet, count=args.drift_count,
                                         pace=args.drift_pace))
    if run.wants("change") and run.fleet is not None:
        run.add("change", scenarios.change(rig, run.fleet, changes=args.changes))
    if shared is not None:
        time.sleep(max(0.0, shared_since + args.shared_duration - time.time()))
        run.add("shared", scenarios.shared_rows(rig, args.shared_n, shared[1], shared_since,
                                                time.time()))
    if run.wants("restart") and run.fleet is not None:
        rig.log(f"restart: {args.restart_baseline:.0f} s baseline, then "
                f"{args.restart_window:.0f} s after the restart")
        run.add("restart", scenarios.restart(rig, run.fleet, baseline=args.restart_baseline,
                                             window_seconds=args.restart_window))
    if run.wants("churn"):
        rig.log(f"churn: {args.churn_rounds} rounds of {args.churn_n} created and deleted")
        run.add("churn", scenarios.churn(rig, size=args.churn_n, rounds=args.churn_rounds))
    if run.wants("memory"):
        rig.stop_operator()  # it would fight the namespace controller over the targets
        for leftover in [f for f in (run.fleet, shared[0] if shared else None) if f]:
            rig.log(f"  {leftover.tag} deleted in {rig.delete_fleet(leftover):.0f} s")
        run.fleet = None
        rig.log(f"memory: cold sync of {','.join(map(str, args.memory_sizes))} "
                f"HimitsuSecrets" + (f", baseline {args.baseline_src}"
                                     if args.baseline_src else ""))
        run.add("memory", memory.memory(rig, sizes=args.memory_sizes,
                                        repeat=args.memory_repeat, repeat_upto=args.n,
                                        tree_list=memory.trees(args.baseline_src)))


def _profiler(run: Run, name: str) -> Profiler | None:
    if not run.args.profile:
        return None
    if py_spy_path() is None:
        run.rig.log("warning: --profile needs py-spy (.venv/bin/pip install py-spy)")
        return None
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = run.args.results_dir / f"profile-{name}-{stamp}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    return Profiler(run.rig.op.pid, out, log_path=run.rig.workdir / f"py-spy-{name}.log")


def _finish_profile(profiler: Profiler) -> dict[str, Any]:
    top = figures.top_frames(profiler.stop(), limit=20)
    print(f"profile ({profiler.out}):")
    for kind in ("self", "total"):
        print(f"  top by {kind} time:")
        for frame, share in top[kind][:15]:
            print(f"    {share:5.1f}%  {frame}")
    return {"file": str(profiler.out), **top}


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    apply_quick(args)
    signal.signal(signal.SIGTERM, _raise_interrupt)  # stop our processes on SIGTERM too
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="himitsu-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC)
    rig = Rig(workdir, operator_args=args.operator_arg, audit_log_maxsize=args.audit_log_maxsize,
              operator_python=args.operator_python.absolute(),
              log=lambda msg: print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True))
    run = Run(args, rig)
    memory.trees(args.baseline_src)  # a wrong --baseline-src fails now, not after an hour
    clean = False
    failure = ""
    try:
        rig.log(f"workdir {workdir}; scenarios {','.join(args.scenarios)}")
        rig.start()
        run_all(run)
        rig.check_audit()
        clean = True
    except KeyboardInterrupt:
        rig.log("interrupted: stopping every process we started")
    except AuditGap as exc:
        failure = str(exc)
        rig.log(f"BENCH FAILED: {failure}")
    except Exception as exc:  # keep the rows so far: a late scenario's timeout loses none
        traceback.print_exc()
        rig.log(f"bench stopped: {type(exc).__name__}: {exc}")
    finally:
        with contextlib.suppress(Exception):
            if rig.audit is not None:
                rig.audit.close()
        rig.close()
    elapsed = (datetime.now(UTC) - started).total_seconds()
    if run.rows:
        print("\n" + report.format_table(run.rows))
        meta = {"started": started.isoformat(), "seconds": elapsed, "argv": sys.argv,
                "settings": {k: (str(v) if isinstance(v, Path) else v)
                             for k, v in vars(args).items()},
                "cpus": os.cpu_count(), "complete": clean, "failure": failure or None,
                "audit_rotations": rig.audit.rotations if rig.audit else None}
        stamp = started.strftime("%Y%m%dT%H%M%SZ")
        path = report.write_json(args.results_dir / f"bench-{stamp}.json",
                                 report.document(run.rows, meta=meta, scenarios=run.raw))
        print(f"\n{json.dumps(report.summary_counts(run.rows))}; {elapsed / 60:.1f} min; "
              f"JSON: {path}")
    if clean and not args.keep_workdir and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    elif not clean:
        print(f"logs kept in {workdir}", file=sys.stderr)
    if failure:
        print(f"BENCH FAILED: {failure}", file=sys.stderr)
        return 2
    return 0 if clean else 1
