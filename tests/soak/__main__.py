"""``make soak``: set up, run the schedule with the user driver, check, print the report.

SOAK_MINUTES (default 30), SOAK_SEED (default: drawn and printed), SOAK_OBJECTS (default
300), SOAK_ACT_INTERVAL (seconds between user acts, default 1), SOAK_FAULTS (fault kinds,
comma-separated: only these), SOAK_DIR (work directory, default .local/soak-<seed>-<time>).
Exit status 1 when any invariant was violated.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from e2e import cluster_setup
from e2e.kubehelp import REPO, secret_path

from . import fleet as fl
from .checker import Config, check
from .driver import Driver, b64
from .faults import FaultRunner
from .observe import Follower, Recorder, Watcher
from .records import Injected, Quiet, Text
from .report import render
from .rig import LEASE, SA_PREFIX, Rig
from .schedule import Fault, Phase, Schedule, draw

SETUP_READY_TIMEOUT = 900.0
SCRAPE_EVERY = 30.0


def say(text: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", flush=True)


def _ready(hsec: Mapping[str, Any]) -> bool:
    conditions = (hsec.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _in_soak(obj: Mapping[str, Any]) -> bool:
    return str((obj.get("metadata") or {}).get("namespace", "")).startswith("soak-")


def main() -> int:
    minutes = float(os.environ.get("SOAK_MINUTES") or 30)
    seed = int(os.environ.get("SOAK_SEED") or secrets.randbelow(1_000_000))
    objects = int(os.environ.get("SOAK_OBJECTS") or 300)
    act_interval = float(os.environ.get("SOAK_ACT_INTERVAL") or 1.0)
    workdir = Path(os.environ.get("SOAK_DIR")
                   or REPO / ".local" / f"soak-{seed}-{int(time.time())}").resolve()
    n_envs = max(4, objects // 15)
    kinds = tuple(k for k in (os.environ.get("SOAK_FAULTS") or "").split(",") if k)
    schedule = draw(seed, minutes, environments=n_envs, tokens=n_envs + 3, kinds=kinds)
    print("\n".join(schedule.describe()), flush=True)
    say(f"seed={seed} minutes={minutes:g} objects={objects} workdir={workdir}")
    recorder = Recorder()
    rig = Rig(workdir)
    watchers: list[Watcher] = []
    follower: Follower | None = None
    try:
        kube = rig.start_control_plane()
        assert rig.standin is not None
        standin = rig.standin
        say(f"control plane up: {rig.local.server_url}; stand-in {standin.url}")
        projects = [str(uuid.uuid4()) for _ in range(fl.PROJECTS)]
        env_ids = [str(standin.call("POST", "/environments",
                                    {"project": projects[i % fl.PROJECTS]})["environment"])
                   for i in range(n_envs)]
        fleet = fl.plan(random.Random(seed), objects, project_ids=projects, env_ids=env_ids)
        for token in fleet.tokens:
            body = {"project": projects[token.project]}
            if token.environment is not None:
                body["environment"] = env_ids[token.environment]
            token.token = str(standin.call("POST", "/tokens", body)["token"])
            fleet.issued.add(token.token)
        watchers = _start_watchers(rig, recorder)
        assert rig.local.audit_log_path is not None
        follower = Follower(audit_path=rig.local.audit_log_path,
                            user_prefix=cluster_setup.username(SA_PREFIX),
                            standin_call=standin.call, sink=recorder.add).start()
        for ns in fleet.namespaces:
            cluster_setup.ensure_namespace(kube, ns)
            for token in fleet.tokens:
                kube.create(secret_path(ns), {
                    "apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": token.secret_name, "namespace": ns},
                    "data": {"token": b64(token.token)}})
            kube.create(secret_path(ns), {
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "bystander", "namespace": ns},
                "data": {"FOREIGN_BYSTANDER": b64(fleet.value("bystander"))}})
        driver = Driver(fleet, kube, standin_call=standin.call, api_url=standin.url,
                        rng=random.Random(seed + 1), sink=recorder.add)
        driver.publish_initial()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(driver.create_member, list(fleet.members.values())))
        say(f"fleet created: {len(fleet.members)} HimitsuSecrets in {len(fleet.namespaces)} "
            f"namespaces, {n_envs} environments, {len(fleet.tokens)} tokens")
        rig.start_operators()
        say("operators started; waiting for every HimitsuSecret to be Ready")
        _wait_all_ready(watchers[0], len(fleet.members))
        start = time.time()
        say("setup done: the soak begins")
        runner = FaultRunner(rig, env_ids=env_ids, tokens=[t.token for t in fleet.tokens],
                             bump=lambda: _bump(driver, fleet), sink=recorder.add, log=say)
        _run_schedule(schedule, start, rig=rig, runner=runner, driver=driver,
                      recorder=recorder, act_interval=act_interval)
        runner.abort.set()
        runner.drain()
        end = time.time()
        _scrape(rig, recorder)
        follower.stop()
        for watcher in watchers:
            watcher.stop()
        for path in rig.log_paths():
            recorder.add(Text(end, path.name, path.read_text(errors="replace")))
        operator_restarts = sum(len(r.supervisor.exits) for r in rig.replicas.values())
        peak = {r.name: r.peak_rss_kib / 1024 for r in rig.replicas.values()}
        fault_errors = list(runner.errors)
    finally:
        if follower is not None:
            follower.audit.close()
        for watcher in watchers:
            watcher.stop()
        rig.stop()
    records = recorder.snapshot()
    with open(workdir / "records.pickle", "wb") as fh:  # for a re-check: python -m soak.recheck
        pickle.dump(records, fh)
    findings = check(records, Config(operator_users=rig.operator_users, lease=LEASE,
                                     issued=frozenset(fleet.issued), start=start))
    print(render(start=start, seed=seed, minutes=minutes, objects=objects,
                 changes=driver.done, failed=driver.failed,
                 injected=[r for r in records if isinstance(r, Injected)],
                 findings=findings, operator_restarts=operator_restarts,
                 peak_rss_mib=peak, fault_errors=fault_errors), flush=True)
    say(f"logs and records kept in {workdir}")
    return 1 if findings.violations else 0


def _start_watchers(rig: Rig, recorder: Recorder) -> list[Watcher]:
    common = {"server": rig.local.server_url, "token": rig.local.admin_token,
              "ca": rig.local.ca_path, "sink": recorder.add}
    lease_ns = cluster_setup.OPERATOR_NAMESPACE
    return [Watcher(path=path, kind=kind, keep=keep, **common).start()  # type: ignore[arg-type]
            for path, kind, keep in (
                ("/apis/himitsu.io/v1alpha1/himitsusecrets", "HimitsuSecret", _in_soak),
                ("/api/v1/secrets", "Secret", _in_soak),
                ("/apis/apps/v1/deployments", "Deployment", _in_soak),
                (f"/apis/coordination.k8s.io/v1/namespaces/{lease_ns}/leases", "Lease",
                 lambda _o: True),
                ("/api/v1/events", "Event", _in_soak))]


def _wait_all_ready(hsec_watcher: Watcher, count: int) -> None:
    deadline = time.monotonic() + SETUP_READY_TIMEOUT
    while time.monotonic() < deadline:
        known = list(hsec_watcher.known.values())
        ready = sum(1 for h in known if _ready(h))
        if len(known) >= count and ready == len(known):
            return
        time.sleep(2.0)
    raise RuntimeError(f"setup: only {ready} of {count} HimitsuSecrets became Ready")


def _bump(driver: Driver, fleet: fl.Fleet) -> None:
    for env in driver.rng.sample(fleet.environments, min(5, len(fleet.environments))):
        key = driver.rng.choice(sorted(env.data))
        driver.set_values(env, {key: fleet.value(key)}, "himitsu-set")


def _scrape(rig: Rig, recorder: Recorder) -> None:
    for replica in rig.replicas.values():
        replica.sample_rss()
        with contextlib.suppress(requests.RequestException):  # restarting or frozen
            recorder.add(Text(time.time(), f"metrics of replica {replica.name}",
                              replica.process.scrape()))


def _run_schedule(schedule: Schedule, start: float, *, rig: Rig, runner: FaultRunner,
                  driver: Driver, recorder: Recorder, act_interval: float) -> None:
    faults = list(schedule.faults)
    last_scrape = 0.0
    acting, stop = threading.Event(), threading.Event()
    user = threading.Thread(target=driver.run, name="driver", daemon=True,
                            kwargs={"acting": acting, "stop": stop, "interval": act_interval})
    user.start()
    try:
        for phase in schedule.phases:
            last_scrape = _run_phase(phase, start, faults, last_scrape, rig=rig, runner=runner,
                                     driver=driver, recorder=recorder, acting=acting)
    finally:
        stop.set()
        acting.clear()
        user.join(timeout=60)


def _run_phase(phase: Phase, start: float, faults: list[Fault], last_scrape: float, *,
               rig: Rig, runner: FaultRunner, driver: Driver, recorder: Recorder,
               acting: threading.Event) -> float:
    phase_end = start + phase.end
    if phase.quiet:
        acting.clear()
        with driver.busy:  # the act under way ends first
            runner.drain()
        quiet_start = time.time()
        say(f"quiet phase until t+{phase.end:.0f}s")
        if phase_end - quiet_start > 10.0:
            recorder.add(Quiet(quiet_start, phase_end))
        else:
            say("a fault overran the chaos phase: this quiet phase is too short to judge")
    else:
        say(f"chaos phase until t+{phase.end:.0f}s")
        acting.set()
    while (now := time.time()) < phase_end:
        while faults and start + faults[0].at <= now and not phase.quiet:
            fault = faults.pop(0)
            say(f"fault {fault.describe()}")
            runner.begin(fault)
        if now - last_scrape >= SCRAPE_EVERY:
            _scrape(rig, recorder)
            last_scrape = now
        elif now - rig.rss_sampled >= 2.0:  # often: a killed process leaves no peak behind
            rig.sample_rss(now)
        time.sleep(0.05)
    return last_scrape


if __name__ == "__main__":
    sys.exit(main())
