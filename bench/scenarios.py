"""The scenarios: cold sync, steady state, shared environment, drift, change, restart,
churn.

Each returns the table rows it contributes and a JSON-able dict of everything it saw.
Targets come from issue 5 (RSS from issue 15); the figures are medians over repetitions
(cold sync) or over consecutive windows (steady state) where a single run would be noisy,
and p50/p99 over many samples for latencies.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from . import figures
from .kubeapi import b64, hsec_path, secret_path
from .measure import (
    ReadyTracker,
    SecretWatch,
    Snapshot,
    WindowFigures,
    himitsu_records,
    snapshot,
    wait_for,
    window,
)
from .report import Row, Target
from .rig import FOREIGN_KEY, AuditGap, Fleet, Member, Rig

Result = tuple[list[Row], dict[str, Any]]

COLD_TARGET = {1000: 20.0, 5000: 120.0}
RSS_TARGET = {1000: 60.0, 5000: 100.0, 10000: 160.0}  # issue 15 (issue 5 had 150, 300)
TAMPERED = "tampered-by-bench"


def duration_seconds(text: str) -> float:
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    return float(text[:-1]) * units[text[-1]]


def cold_sync(rig: Rig, size: int, rep: int, *, refresh: str) -> tuple[Fleet, dict[str, Any]]:
    """``size`` HimitsuSecrets created at once (the caller starts a fresh operator first);
    seconds until all are Ready, counted from the start of creation."""
    fleet = rig.prepare_fleet(f"c{size}r{rep}", size, refresh=refresh, envs=rig.envs)
    with ReadyTracker(rig, fleet) as tracker:
        a = snapshot(rig)
        started = time.monotonic()
        created = rig.create_hsecs(fleet)
        ok = tracker.wait(timeout=max(600.0, size * 0.5))
        b = snapshot(rig)
        ready = tracker.last - started if ok else None
    win = window(rig, a, b)
    if ok and win.kube_total == 0:  # it wrote every Secret: the log cannot be empty
        raise AuditGap(f"cold sync {size}: all Ready, yet no request of the operator in "
                       f"the audit log")
    memory = rig.op.memory_mib()
    outcome = f"Ready in {ready:.1f} s" if ready else "NOT all Ready"
    rig.log(f"  cold sync {size} #{rep}: created in {created:.1f} s, {outcome}; "
            f"{len(tracker.ready_at)}/{size} ready; rss {memory['rss']:.0f} MiB")
    return fleet, {
        "size": size, "rep": rep, "refresh": refresh, "created_seconds": created,
        "ready_seconds": ready, "ready_count": len(tracker.ready_at),
        "reconciles_per_second": figures.per_unit(win.reconciles, ready or 0.0),
        "memory_mib": memory, "window": win.to_json(),
    }


def cold_rows(size: int, runs: list[dict[str, Any]]) -> list[Row]:
    done = [r for r in runs if r["ready_seconds"] is not None]
    label = f"cold sync {size}"
    note = f"median of {len(done)}/{len(runs)} runs"

    def med(key: str) -> float | None:
        values = [float(r[key]) for r in done if r.get(key) is not None]
        return figures.median(values) if values else None

    himitsu_429 = sum(r["window"]["himitsu_429"] for r in runs)
    kube_429 = sum(r["window"]["kube_429"] for r in runs)
    kube = [sum(r["window"]["kube_requests"].values()) / size for r in done]
    return [
        Row(label, "seconds until all Ready", med("ready_seconds"), "s", 1,
            Target("<=", COLD_TARGET[size]) if size in COLD_TARGET else None,
            f"{note}; clock starts when creation starts"),
        Row(label, "creation time (admin, 8 threads)", med("created_seconds"), "s", 1),
        Row(label, "reconciles/s", med("reconciles_per_second"), "/s", 0),
        Row(label, "kube requests per HimitsuSecret", figures.median(kube) if kube else None,
            "", 2, note="operator's user, audit log"),
        Row(label, "429s (Himitsu + kube-apiserver)", float(himitsu_429 + kube_429), "", 0,
            Target("==", 0), f"Himitsu {himitsu_429}, kube {kube_429}, all runs"),
        Row(label, "operator RSS when all Ready",
            figures.median([r["memory_mib"]["rss"] for r in runs]), "MiB", 0,
            Target("<=", RSS_TARGET[size]) if size in RSS_TARGET else None),
    ]


def converge(rig: Rig, fleet: Fleet, refresh: str) -> float:
    """Switch a fleet to ``refresh`` and wait until every member is Ready at the new
    generation; seconds taken."""
    with ReadyTracker(rig, fleet) as tracker:
        started = time.monotonic()
        rig.set_refresh(fleet, refresh)
        if not tracker.wait(timeout=max(300.0, len(fleet.members) * 0.5)):
            raise TimeoutError(f"{len(tracker.ready_at)}/{len(fleet.members)} HimitsuSecrets "
                               f"Ready after switching to refreshInterval {refresh}")
        return tracker.last - started


def steady(rig: Rig, fleet: Fleet, *, duration: float, windows: int, warmup: float,
           suffix: str = "") -> Result:
    """Per-poll costs over consecutive windows; the median window is reported. ``suffix``
    names the operator's tree in the scenario column (a baseline's)."""
    interval = duration_seconds(fleet.refresh)
    n = len(fleet.members)
    began = rig.op.metrics()
    time.sleep(warmup)
    # And one whole round polled: a fresh (or saturated) operator's first polls of each
    # object cost more (reads, Events) and are not steady state.
    wait_for(lambda: figures.metric_delta(began, rig.op.metrics(), "himitsu_syncs_total")
             >= n, timeout=max(120.0, 10 * interval), interval=2.0)
    shots = [snapshot(rig)]
    for _ in range(windows):
        time.sleep(duration / windows)
        shots.append(snapshot(rig))
    wins: list[WindowFigures] = [window(rig, a, b) for a, b in itertools.pairwise(shots)]
    memory = rig.op.memory_mib()
    per = [w.per_poll() for w in wins]

    def med(key: str) -> float | None:
        values = [p[key] for p in per if p.get(key) is not None]
        return figures.median([float(v) for v in values if v is not None]) if values else None

    achieved = figures.median([w.polls / w.seconds for w in wins])
    verbs = sorted({k for p in per for k in p if k.startswith("kube[")})
    label = f"steady {n} @{fleet.refresh}{suffix}"
    note = f"median of {windows} windows of {duration / windows:.0f} s"
    rows = [
        Row(label, "polls/s achieved (nominal)", achieved, "/s", 1,
            note=f"nominal {n / interval:.0f}/s; {note}"),
        Row(label, "Himitsu requests per poll", med("himitsu"), "", 3,
            note=f"{len(rig.envs)} sources: ideal {len(rig.envs) / n:.3f}"),
        Row(label, "kube-apiserver requests per poll", med("kube"), "", 2, Target("<=", 1),
            "operator's user in the audit log, every verb"),
        *[Row(label, f"  {verb[5:-1]} per poll", med(verb), "", 3) for verb in verbs],
        Row(label, "operator CPU per poll", med("cpu_ms"), "ms", 2, Target("<=", 3),
            "utime+stime of the process / polls"),
        Row(label, "operator RSS", memory["rss"], "MiB", 0,
            Target("<=", RSS_TARGET.get(n, RSS_TARGET[1000])) if n <= 5000 else None,
            f"peak {memory['peak_rss']:.0f} MiB"),
        Row(label, "429s (Himitsu + kube-apiserver)",
            float(sum(w.himitsu_429 + w.kube_429 for w in wins)), "", 0, Target("==", 0)),
    ]
    return rows, {"fleet": n, "refresh": fleet.refresh, "memory_mib": memory,
                  "windows": [w.to_json() for w in wins]}


def ratio_rows(this: list[Row], base: list[Row], *, limits: dict[str, float]) -> list[Row]:
    """this / baseline for each figure in ``limits`` (the ratio's upper bound), same run."""
    rows = []
    for figure, limit in limits.items():
        a = next((r for r in this if r.figure == figure), None)
        b = next((r for r in base if r.figure == figure), None)
        if a is None or b is None:
            continue
        ratio = a.value / b.value if a.value is not None and b.value else None
        rows.append(Row(b.scenario, f"{figure} ratio (this tree / baseline)", ratio, "", 2,
                        Target("<=", limit), f"{a.shown_value()} vs {b.shown_value()}"))
    return rows


def shared_fleet(rig: Rig, size: int) -> tuple[Fleet, str]:
    """``size`` HimitsuSecrets in one namespace reading one environment with one token."""
    env = rig.new_env(len(rig.envs) + 50)
    rig.envs.append(env)
    fleet = rig.prepare_fleet("shared", size, refresh="1m", envs=[env], namespaces=1,
                              merge_every=0)
    with ReadyTracker(rig, fleet) as tracker:
        rig.create_hsecs(fleet)
        if not tracker.wait(timeout=max(300.0, size * 0.5)):
            raise TimeoutError(f"shared fleet: {len(tracker.ready_at)}/{size} Ready")
    return fleet, env.environment


def shared_rows(rig: Rig, size: int, environment: str, since: float, until: float) -> Result:
    records = himitsu_records(rig, since, until, environments=[environment])
    minutes = (until - since) / 60.0
    per_minute = len(records) / minutes
    limited = sum(1 for r in records if r.get("status") == 429)
    label = f"shared env {size} @1m"
    rows = [
        Row(label, "Himitsu requests per minute", per_minute, "/min", 2, Target("<=", 1.5),
            f"{len(records)} requests in {until - since:.0f} s, one env + one token; ~1 wanted"),
        Row(label, "Himitsu 429s", float(limited), "", 0, Target("==", 0)),
    ]
    return rows, {"size": size, "seconds": until - since, "requests": len(records),
                  "per_minute": per_minute, "status_429": limited,
                  "statuses": sorted({str(r.get("status")) for r in records})}


def _restored(member: Member, data: dict[str, str], expected: dict[str, str]) -> bool:
    if any(data.get(k) != v for k, v in expected.items()):
        return False
    extra = set(data) - set(expected)
    return not extra if member.policy == "Owner" else extra <= {FOREIGN_KEY}


def drift(rig: Rig, fleet: Fleet, *, count: int, pace: float) -> Result:
    """Delete or edit ``count`` targets (Owner and Merge, a quarter each way), one every
    ``pace`` seconds; latency from the damaging watch event to the restoring one."""
    owners = [m for m in fleet.members if m.policy == "Owner"]
    merges = [m for m in fleet.members if m.policy == "Merge"]
    quarter = max(1, count // 4)
    plan = ([(m, "delete") for m in owners[:quarter]] + [(m, "edit") for m in owners[-quarter:]]
            + [(m, "delete") for m in merges[:quarter]] + [(m, "edit") for m in merges[-quarter:]])
    by_key = {f"{m.namespace}/{m.target}": (m, action) for m, action in plan}
    damaged: dict[str, float] = {}
    restored: dict[str, float] = {}

    def on_change(at: float, kind: str, key: str, data: dict[str, str] | None) -> None:
        if key not in by_key or key in restored:
            return
        member, _ = by_key[key]
        if data is None or data.get("KEY_01") == TAMPERED:
            damaged.setdefault(key, at)
        elif key in damaged and _restored(member, data, rig.env(member.env).values):
            restored[key] = at

    with SecretWatch(rig, on_change):
        started = time.monotonic()
        for index, (member, action) in enumerate(plan):
            time.sleep(max(0.0, started + index * pace - time.monotonic()))
            path = secret_path(member.namespace, member.target)
            if action == "delete":
                rig.kube.delete(path)
            else:
                rig.kube.merge_patch(path, {"data": {"KEY_01": b64(TAMPERED)}})
        wait_for(lambda: len(restored) >= len(plan), timeout=120.0)
    latencies = {key: restored[key] - damaged[key] for key in restored if key in damaged}
    summary = figures.summarize(list(latencies.values()))
    groups = {f"{m.policy} {action}": figures.summarize(
        [latencies[k] for k, (mm, a) in by_key.items() if k in latencies
         and (mm.policy, a) == (m.policy, action)]) for m, action in plan}
    note = (f"{len(latencies)}/{len(plan)} restored; one every {pace:g} s; "
            + ", ".join(f"{g} p99 {s['p99']:.2f}" for g, s in groups.items()
                        if s["p99"] is not None))
    label = f"drift repair {len(plan)}"
    rows = [
        Row(label, "p50 seconds until restored", summary["p50"], "s", 2, note=note),
        Row(label, "p99 seconds until restored", summary["p99"], "s", 2, Target("<=", 1)),
    ]
    if len(latencies) < len(plan):
        rows.append(Row(label, "targets never restored", float(len(plan) - len(latencies)),
                        "", 0, Target("==", 0)))
    return rows, {"planned": len(plan), "pace": pace, "summary": summary, "groups": groups,
                  "latencies": sorted(latencies.values())}


def change(rig: Rig, fleet: Fleet, *, changes: int) -> Result:
    """Change KEY_00 in ``changes`` environments at once; per Secret, seconds from the
    change until the Secret holds the new value."""
    interval = duration_seconds(fleet.refresh)
    env_ids = sorted({m.env for m in fleet.members})[:changes]
    affected = {f"{m.namespace}/{m.target}": m for m in fleet.members if m.env in env_ids}
    wanted: dict[int, str] = {}
    changed_at: dict[int, float] = {}
    updated: dict[str, float] = {}

    def on_change(at: float, kind: str, key: str, data: dict[str, str] | None) -> None:
        member = affected.get(key)
        if member is None or data is None or key in updated:
            return
        value = wanted.get(member.env)
        if value is not None and data.get("KEY_00") == value:
            updated[key] = at

    with SecretWatch(rig, on_change):
        for env_id in env_ids:
            env = rig.env(env_id)
            changed_at[env_id] = time.monotonic()
            wanted[env_id] = rig.change_value(env, "KEY_00")
        # Generous: a saturated operator (polls/s below nominal) takes several rounds.
        wait_for(lambda: len(updated) >= len(affected), timeout=10 * interval + 60)
    latencies = [updated[k] - changed_at[m.env] for k, m in affected.items() if k in updated]
    per_change = [max(updated[k] - changed_at[e] for k, m in affected.items()
                      if m.env == e and k in updated) for e in env_ids
                  if any(m.env == e and k in updated for k, m in affected.items())]
    summary = figures.summarize(latencies)
    label = f"change propagation @{fleet.refresh}"
    target = Target("<=", interval + 1.0)
    note = (f"{len(env_ids)} changes, {len(latencies)}/{len(affected)} Secrets updated; "
            f"refreshInterval {fleet.refresh}")
    rows = [
        Row(label, "p50 seconds until a Secret holds it", summary["p50"], "s", 2, note=note),
        Row(label, "p99 seconds until a Secret holds it", summary["p99"], "s", 2, target),
        Row(label, "max seconds until every affected Secret", max(per_change, default=None),
            "s", 2, target, f"worst of {len(per_change)} changes"),
    ]
    if len(latencies) < len(affected):
        rows.append(Row(label, "Secrets never updated", float(len(affected) - len(latencies)),
                        "", 0, Target("==", 0), f"within {10 * interval + 60:.0f} s"))
    return rows, {"refresh": fleet.refresh, "changes": len(env_ids), "affected": len(affected),
                  "summary": summary, "per_change_max": per_change}


def restart(rig: Rig, fleet: Fleet, *, baseline: float, window_seconds: float) -> Result:
    """Requests in the first ``window_seconds`` after a restart, against the same span of
    steady state just before it."""
    a = snapshot(rig)
    time.sleep(baseline)
    before = window(rig, a, snapshot(rig))
    scale = window_seconds / before.seconds
    stop_began = time.time()
    rig.stop_operator()
    op = rig.start_operator()
    began = op.child.started_wall
    time.sleep(max(0.0, began + window_seconds - time.time()))
    after = window(rig, snapshot_at_start(began), snapshot(rig), cpu=False)
    buckets = {"himitsu": figures.bucket_counts(after.himitsu_times, start=began, width=10,
                                                buckets=int(window_seconds // 10)),
               "kube": figures.bucket_counts(after.kube_times, start=began, width=10,
                                             buckets=int(window_seconds // 10))}
    peak = {"himitsu": max(figures.bucket_counts(after.himitsu_times, start=began, width=1,
                                                 buckets=int(window_seconds)), default=0),
            "kube": max(figures.bucket_counts(after.kube_times, start=began, width=1,
                                              buckets=int(window_seconds)), default=0),
            "kube_before": max(figures.bucket_counts(before.kube_times, start=a.wall, width=1,
                                                     buckets=int(before.seconds)), default=0)}
    expected_h = before.himitsu * scale
    expected_k = before.kube_without_watches() * scale
    label = f"restart {len(fleet.members)} @{fleet.refresh}"
    span = f"first {window_seconds:.0f} s"
    rows = [
        Row(label, f"Himitsu requests, {span}", float(after.himitsu), "", 0,
            Target("<=", round(1.25 * expected_h, 1)),
            f"steady before: {expected_h:.0f} per {window_seconds:.0f} s; 10 s buckets "
            f"{buckets['himitsu']}"),
        Row(label, f"kube requests (no list/watch), {span}",
            float(after.kube_without_watches()), "", 0, Target("<=", round(1.25 * expected_k)),
            f"steady before: {expected_k:.0f}; peak/s {peak['kube']} vs {peak['kube_before']} "
            f"before; 10 s buckets {buckets['kube']}"),
        Row(label, f"kube requests by verb, {span}", float(after.kube_total), "", 0,
            note=", ".join(f"{v} {n}" for v, n in sorted(after.kube.items()))),
        Row(label, "downtime (stop + start until ready)", op.ready_wall - stop_began, "s", 1),
    ]
    return rows, {"before": before.to_json(), "after": after.to_json(), "buckets": buckets,
                  "peak_per_second": peak, "window_seconds": window_seconds}


def snapshot_at_start(began: float) -> Snapshot:
    """A zero snapshot at process start: a new operator's counters and CPU start at 0."""
    return Snapshot(wall=began, mono=time.monotonic() - (time.time() - began), cpu=0.0,
                    metrics={})


def churn(rig: Rig, *, size: int, rounds: int) -> Result:
    """``rounds`` times: a fresh fleet of ``size`` HimitsuSecrets (new namespaces, names,
    token Secrets and targets) is created, Ready, deleted, and its namespaces removed;
    RSS once the operator's queue is empty. Memory that follows live objects comes back
    to the same level every round; state kept per name ever seen grows."""
    rss: list[float] = []
    for number in range(1, rounds + 1):
        rss.append(_churn_round(rig, rig.prepare_fleet(f"churn{number}", size, refresh="1m",
                                                       envs=rig.envs)))
        rig.log(f"  churn round {number}/{rounds}: {size} created, Ready, deleted; "
                f"rss {rss[-1]:.1f} MiB")
    growth = (rss[-1] - rss[0]) / rss[0] * 100.0
    label = f"churn {rounds} x {size}"
    return [
        Row(label, "RSS growth, last round vs first", growth, "%", 1, Target("<=", 10.0),
            "after each round: " + ", ".join(f"{v:.0f}" for v in rss) + " MiB"),
    ], {"size": size, "rounds": rounds, "rss_mib": rss}


def _churn_round(rig: Rig, fleet: Fleet) -> float:
    """Create the fleet, wait until Ready, delete it and its namespaces; RSS in MiB."""
    size = len(fleet.members)
    with ReadyTracker(rig, fleet) as tracker:
        rig.create_hsecs(fleet)
        if not tracker.wait(timeout=max(600.0, size * 0.5)):
            raise TimeoutError(f"{fleet.tag}: {len(tracker.ready_at)}/{size} Ready")
    rig.parallel(lambda m: rig.kube.delete(hsec_path(m.namespace, m.name)), fleet.members)
    if not wait_for(lambda: not rig.kube.get(hsec_path(), labelSelector=fleet.selector,
                                             limit=1)["items"], timeout=300.0):
        raise TimeoutError(f"{fleet.tag}: HimitsuSecrets not deleted")
    rig.delete_fleet(fleet)  # token Secrets, Merge targets, namespaces
    if not wait_for(lambda: figures.metric_sum(rig.op.metrics(), "workqueue_depth") == 0,
                    timeout=120.0):
        raise TimeoutError(f"{fleet.tag}: the operator's queue did not drain")
    return float(rig.op.memory_mib()["rss"])
