"""The soak's invariant checker must catch what it promises to catch.

A checker that cannot fail proves nothing: each rule is fed a recorded stream that
breaks it (and the same stream without the break, which must pass), built by hand from
the records the soak collects (watch events, audit writes, requests, acts, faults).
"""

from __future__ import annotations

import base64
import math
import sys
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[2]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from soak.checker import Config, Findings, check  # noqa: E402
from soak.records import Acted, Injected, Polled, Quiet, Text, Watched, Written  # noqa: E402
from soak.world import fingerprint  # noqa: E402

NS = "soak-00"
ENV = "0c0c0c0c-0000-4000-8000-000000000001"
PROJECT = "0c0c0c0c-0000-4000-8000-0000000000aa"
TOKEN = "himi_0123456789abcdef_" + "A" * 43
OP_A = "system:serviceaccount:himitsu-system:himitsu-operator-a"
OP_B = "system:serviceaccount:himitsu-system:himitsu-operator-b"
LEASE = "himitsu-operator.himitsu.io"
CONFIG = Config(operator_users=frozenset({OP_A, OP_B}), lease=LEASE,
                issued=frozenset({"CANARY-a-1", TOKEN}))


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def secret(name: str, data: dict[str, str], rv: int, *, version: int = 1,
           stype: str = "Opaque") -> dict[str, Any]:
    return {"kind": "Secret", "type": stype,
            "metadata": {"namespace": NS, "name": name, "resourceVersion": str(rv),
                         "annotations": {"himitsu.io/config-version": str(version)}},
            "data": {k: b64(v) for k, v in data.items()}}


def hsec(name: str = "hs-1", *, target: str = "tgt-1", policy: str = "Owner",
         fmt: str = "KeyValue", refresh: str = "10s", ready: str = "True", rv: int = 1,
         deployment: str | None = None, version: int = 2) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "apiUrl": "http://127.0.0.1:1", "projectId": PROJECT, "environmentId": ENV,
        "authSecretRef": {"name": "tok-0"}, "refreshInterval": refresh,
        "target": {"name": target, "creationPolicy": policy, "template": {"format": fmt}}}
    if deployment:
        spec["rolloutRestartTargets"] = [{"kind": "Deployment", "name": deployment}]
    return {"kind": "HimitsuSecret",
            "metadata": {"namespace": NS, "name": name, "generation": 1,
                         "resourceVersion": str(rv)},
            "spec": spec,
            "status": {"observedGeneration": 1, "configVersion": version, "conditions": [
                {"type": "Ready", "status": ready, "reason": "Synced"}]}}


def deployment(name: str, stamp: str | None, rv: int) -> dict[str, Any]:
    annotations = {"himitsu.io/restartedAt": stamp} if stamp else {}
    return {"kind": "Deployment",
            "metadata": {"namespace": NS, "name": name, "resourceVersion": str(rv)},
            "spec": {"template": {"metadata": {"annotations": annotations}}}}


def w(time: float, obj: dict[str, Any], kind: str | None = None,
      type_: str = "MODIFIED") -> Watched:
    return Watched(time, kind or str(obj["kind"]), type_, obj)


def himitsu(time: float, data: dict[str, str], version: int,
            kind: str = "himitsu-set") -> Acted:
    return Acted(time, kind, environment=ENV, data=data, version=version)


def base(data: dict[str, str] | None = None, **hsec_args: Any) -> list[Any]:
    """A synced HimitsuSecret: Himitsu holds ``data``, the target renders it."""
    data = data or {"A": "1", "B": "2"}
    return [himitsu(0.0, data, 2, "himitsu-initial"),
            w(1.0, secret("tok-0", {"token": TOKEN}, 5), type_="ADDED"),
            w(2.0, hsec(**hsec_args), type_="ADDED"),
            w(3.0, secret(str(hsec_args.get("target", "tgt-1")), data, 10, version=2),
              type_="ADDED")]


def rules(findings: Findings) -> list[str]:
    return [v.rule for v in findings.violations]


# -- targets: deleted, losing keys ------------------------------------------------------------
def test_a_target_deleted_with_no_user_act_is_reported() -> None:
    gone = w(20.0, secret("tgt-1", {"A": "1", "B": "2"}, 11), type_="DELETED")
    assert rules(check([*base(), gone], CONFIG)) == ["target-deleted"]
    user = Acted(19.5, "target-delete", NS, "tgt-1")
    assert rules(check([*base(), user, gone], CONFIG)) == []


def test_a_target_losing_a_key_himitsu_still_holds_is_reported() -> None:
    lost = w(20.0, secret("tgt-1", {"A": "1"}, 11))
    found = check([*base(), lost], CONFIG)
    assert rules(found) == ["target-lost-keys"]
    assert "['B']" in found.violations[0].detail


def test_a_key_removed_in_himitsu_may_leave_the_target() -> None:
    removed = himitsu(15.0, {"A": "1"}, 3, "himitsu-remove")
    lost = w(20.0, secret("tgt-1", {"A": "1"}, 11, version=3))
    assert rules(check([*base(), removed, lost], CONFIG)) == []


def test_the_users_own_edit_of_a_target_is_not_a_loss() -> None:
    edit = Acted(19.0, "target-hand-edit", NS, "tgt-1", rv="11")
    lost = w(20.0, secret("tgt-1", {"A": "1"}, 11))
    assert rules(check([*base(), edit, lost], CONFIG)) == []


# -- foreign keys and Secrets -----------------------------------------------------------------
def test_a_foreign_key_changed_by_anyone_but_the_user_is_reported() -> None:
    data = {"A": "1", "B": "2"}
    start = [*base(data, policy="Merge", target="merge-1")[:3],
             w(3.0, secret("merge-1", {**data, "FOREIGN_X": "mine"}, 10, version=2), type_="ADDED")]
    overwritten = w(20.0, secret("merge-1", {**data, "FOREIGN_X": "theirs"}, 11, version=2))
    assert rules(check([*start, overwritten], CONFIG)) == ["foreign-key-written"]
    removed = w(20.0, secret("merge-1", data, 11, version=2))
    assert rules(check([*start, removed], CONFIG)) == ["foreign-key-written"]
    users_own = Acted(19.0, "foreign-write", NS, "merge-1", rv="11")
    assert rules(check([*start, users_own, overwritten], CONFIG)) == []


def test_an_operator_write_to_a_secret_no_himitsusecret_names_is_reported() -> None:
    foreign = Written(20.0, OP_A, "patch", "secrets", "", NS, "bystander")
    lease = Written(5.0, OP_A, "update", "leases", "", "himitsu-system", LEASE)
    ours = Written(21.0, OP_A, "patch", "secrets", "", NS, "tgt-1")
    assert rules(check([*base(), lease, foreign, ours], CONFIG)) == ["foreign-secret-written"]


# -- quiet phases -----------------------------------------------------------------------------
def polled_throughout() -> list[Polled]:
    return [poll(t) for t in range(20, 96, 10)]


def test_a_target_still_stale_when_a_quiet_phase_ends_is_reported() -> None:
    changed = himitsu(10.0, {"A": "1", "B": "3"}, 3)
    quiet = Quiet(20.0, 95.0)
    polls = polled_throughout()
    found = check([*base(), changed, quiet, *polls], CONFIG)
    assert rules(found) == ["not-converged"]
    assert "stale ['B']" in found.violations[0].detail
    assert found.convergence == [math.inf]
    synced = w(30.0, secret("tgt-1", {"A": "1", "B": "3"}, 11, version=3))
    found = check([*base(), changed, quiet, synced, *polls], CONFIG)
    assert rules(found) == []
    assert found.convergence == [10.0]
    assert found.propagation == [20.0]


def test_ready_false_or_a_blob_that_does_not_read_back_is_not_converged() -> None:
    quiet = Quiet(20.0, 95.0)
    polls = polled_throughout()
    failing = w(10.0, hsec(ready="False"))
    assert rules(check([*base(), failing, quiet, *polls], CONFIG)) == ["not-converged"]
    data = {"A": "1", "B": "2"}
    good = base(data, fmt="Dotenv")
    good[3] = w(3.0, secret("tgt-1", {".env": 'A="1"\nB="2"\n'}, 10), type_="ADDED")
    assert rules(check([*good, quiet, *polls], CONFIG)) == []
    bad = w(10.0, secret("tgt-1", {".env": 'A="1"\n'}, 11))
    assert rules(check([*good, bad, quiet, *polls], CONFIG)) == ["not-converged"]


# -- polls ------------------------------------------------------------------------------------
def poll(time: float, status: int = 304, *, conditional: bool = True) -> Polled:
    return Polled(time, ENV, fingerprint(TOKEN), status, conditional)


def test_a_source_polled_late_in_a_quiet_phase_is_reported() -> None:
    quiet = Quiet(20.0, 95.0)  # timed from 40 s (grace 20 s): refresh 10 s + bound 15 s
    steady = [poll(t) for t in range(40, 96, 10)]
    assert rules(check([*base(), quiet, *steady], CONFIG)) == []
    gap = [p for p in steady if not 50 < p.time < 90]
    found = check([*base(), quiet, *gap], CONFIG)
    assert rules(found) == ["poll-overdue"]
    assert "40.0 s" in found.violations[0].detail


def test_a_full_fetch_right_after_a_304_needs_a_reason() -> None:
    polls = [poll(10.0), poll(20.0, 200, conditional=False)]
    assert rules(check([*base(), *polls], CONFIG)) == ["needless-full-fetch"]
    force = Acted(15.0, "force-sync", NS, "hs-1", environment=ENV)
    found = check([*base(), force, *polls], CONFIG)
    assert rules(found) == []
    assert sum(found.full_fetches.values()) == 1
    fault = Injected(12.0, 13.0, "leader-sigkill", "replica a")  # no reason in itself
    assert rules(check([*base(), fault, *polls], CONFIG)) == ["needless-full-fetch"]
    # a sync cut short: the target got version 3, the status still says 2 (the contract's
    # "config-version annotation does not match observed status")
    half_done = w(15.0, secret("tgt-1", {"A": "1", "B": "3"}, 11, version=3))
    found = check([*base(), fault, half_done, *polls], CONFIG)
    assert rules(found) == []
    assert found.full_fetches == {"its target's config-version not the status's": 1}
    # the user edited the target by hand (before that 304) and it is not repaired yet
    hand: list[Any] = [Acted(5.0, "target-hand-edit", NS, "tgt-1", rv="11"),
            w(5.5, secret("tgt-1", {"A": "x", "B": "2"}, 11))]
    found = check([*base(), *hand, *polls], CONFIG)
    assert rules(found) == []
    assert found.full_fetches == {"its target edited by the user, not yet repaired": 1}
    # a second HimitsuSecret of the source, still at version 1: its data comes in full
    behind = [w(4.0, hsec("hs-2", target="tgt-2", version=1), type_="ADDED"),
              w(4.5, secret("tgt-2", {"A": "1"}, 12, version=1), type_="ADDED")]
    found = check([*base(), *behind, *polls], CONFIG)
    assert rules(found) == []
    assert found.full_fetches == {"HimitsuSecrets of the source at different versions": 1}


# -- leader terms -----------------------------------------------------------------------------
def lease(time: float, user: str) -> Written:
    return Written(time, user, "update", "leases", "", "himitsu-system", LEASE)


def test_a_write_by_a_replica_after_the_other_took_the_lease_is_reported() -> None:
    patch_a = Written(31.0, OP_A, "patch", "himitsusecrets", "status", NS, "hs-1")
    writes = [lease(10.0, OP_A), lease(12.0, OP_A), lease(30.0, OP_B), patch_a,
              lease(32.0, OP_B)]
    found = check([*base(), *writes], CONFIG)
    assert rules(found) == ["write-outside-term"]
    assert found.leaderless == 18.0
    in_term = Written(11.0, OP_A, "patch", "himitsusecrets", "status", NS, "hs-1")
    assert rules(check([*base(), *writes[:3], in_term], CONFIG)) == []


def test_a_write_before_any_lease_is_held_is_reported() -> None:
    early = Written(5.0, OP_B, "create", "secrets", "", NS, "tgt-1")
    assert rules(check([*base(), early, lease(10.0, OP_A)], CONFIG)) == ["write-outside-term"]


# -- restarts ---------------------------------------------------------------------------------
def rollout_base() -> list[Any]:
    return [*base(deployment="dep-1"), w(0.5, deployment("dep-1", None, 4), type_="ADDED")]


def test_a_restart_without_a_data_change_is_reported() -> None:
    change: list[Any] = [himitsu(10.0, {"A": "1", "B": "3"}, 3),
              w(11.0, secret("tgt-1", {"A": "1", "B": "3"}, 20, version=3)),
              w(12.0, deployment("dep-1", "t1", 21))]
    assert rules(check([*rollout_base(), *change], CONFIG)) == []
    again = w(30.0, deployment("dep-1", "t2", 30))
    found = check([*rollout_base(), *change, again], CONFIG)
    assert rules(found) == ["restart-without-change"]


def test_a_data_change_never_restarted_is_reported_when_a_quiet_phase_ends() -> None:
    change: list[Any] = [himitsu(10.0, {"A": "1", "B": "3"}, 3),
              w(11.0, secret("tgt-1", {"A": "1", "B": "3"}, 20, version=3))]
    quiet = Quiet(20.0, 95.0)
    polls = polled_throughout()
    assert rules(check([*rollout_base(), *change, quiet, *polls], CONFIG)) == \
        ["change-not-restarted"]
    # the watch of the Deployment may deliver its restart before the Secret's change
    restart = w(10.9, deployment("dep-1", "t1", 21))
    assert rules(check([*rollout_base(), *change, restart, quiet, *polls], CONFIG)) == []


# -- leaks ------------------------------------------------------------------------------------
def test_a_value_or_token_in_a_log_event_status_or_metric_is_reported() -> None:
    clean = Text(50.0, "replica-a-0.log", '{"event": "synced", "keys": 2}')
    assert rules(check([*base(), clean], CONFIG)) == []
    log = Text(50.0, "replica-a-0.log", '{"event": "oops", "value": "CANARY-a-1"}')
    metric = Text(51.0, "metrics of replica b", f'x{{token="{TOKEN}"}} 1')
    event = w(52.0, {"kind": "Event", "metadata": {"namespace": NS, "name": "e1"},
                     "message": f"token {b64('CANARY-a-1')} refused"}, type_="ADDED")
    status = hsec(rv=9)
    status["status"]["conditions"][0]["message"] = "bad value CANARY-a-1"
    found = check([*base(), log, metric, event, w(53.0, status)], CONFIG)
    assert rules(found) == ["leak"] * 4
    assert not any("CANARY-a-1" in v.detail or TOKEN in v.detail for v in found.violations)
