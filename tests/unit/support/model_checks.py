"""The oracle of the model-based test: the invariants, stated over the in-memory worlds.

It never asks the operator's code what should happen. What a target must hold is
computed here from Himitsu's history and the HimitsuSecret's spec with ``render`` (the
pure function that defines the bytes), what Kubernetes accepts from ``secret_errors``.

Checked as they happen (a violation is recorded, and the machine fails on it after the
step: an assertion raised inside a reconcile would only be logged by the controller):

* ``foreign``: no write ever touches a Secret that is not ours (neither our
  ``himitsu.io/managed`` label nor our controller reference), except a Merge
  HimitsuSecret adding its keys to its own target, foreign keys and metadata kept, and
  a HimitsuSecret relabelling its own target created for it (docs/syncing.md);
* ``rendered``: every target written holds exactly the rendering of Himitsu's data at
  the version its annotation names (nothing emptied, shrunk or half-written);
* ``removal``: a reconcile that deletes a target (an Owner type change) has created the
  replacement by the time it ends, whatever failed;
* ``fresh``: a first sync or a repair (HimitsuSecret created or pointed at another
  source, force-sync, target deleted or its data edited) holds data no older than
  ``FRESH`` seconds before the user's action, once the operator has seen the action and
  reports Synced (other spec edits may keep the data held: it is as current as a timed
  poll's); while Himitsu refuses (429, 5xx, a budget run short) what is written from
  memory is excused and the action stays pending for the next answer;
* ``quiet``: after a restart with every target of a source in sync, no full fetch (200)
  of that source until something changes;
* ``idle``: a wake that is not due costs no Himitsu request and no status write that
  changes nothing (model_quiet.py).

Checked between steps: ``wake`` (every HimitsuSecret with refreshInterval > 0 that the
process knows has a wake in its queue no further ahead than the interval, or the
rate-limit window Himitsu imposed) and, after a quiet period, ``settled`` (every target
equals the rendering of Himitsu's current data, or the HimitsuSecret says why not).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from model_himitsu import WINDOW, Request
from model_kube import DEPLOY, HSEC, SECRET, Change, secret_errors
from model_merge import MergeOracle
from model_quiet import IdleOracle
from model_rollout import RolloutOracle

from himitsu_controller import api
from himitsu_controller.kube import TOKEN_TTL
from himitsu_controller.sync.target import render

if TYPE_CHECKING:
    from model_world import World

CHECKS = frozenset({"foreign", "rendered", "removal", "fresh", "quiet", "wake", "settled",
                    "restart", "idle"})
FRESH = 5.0  # seconds: how old an answer a first sync or a repair may start from
FAILURE_HOLD = 1.0  # seconds a source whose request got a 5xx is not asked again
WAKE_SLACK = 1.0  # seconds: local pacing may hold a poll back this much
NS = "apps"


@dataclass
class Trigger:
    """A user action after which the HimitsuSecret needs Himitsu's current data."""

    what: str
    at: float
    env: str
    required: int  # the version current FRESH seconds before the action
    resource: str
    rv: int  # the change that shows the action to the operator's informer
    seen: bool = False


def is_ours(secret: Mapping[str, Any] | None) -> bool:
    """Our label or our controller reference: anything else is someone else's."""
    if secret is None:
        return False
    meta = secret.get("metadata") or {}
    labelled = (meta.get("labels") or {}).get(api.LABEL_MANAGED) == "true"
    return labelled or any(_our_ref(r) for r in meta.get("ownerReferences") or [])


def _our_ref(ref: Mapping[str, Any]) -> bool:
    return bool(ref.get("controller")) and ref.get("kind") == api.KIND and str(
        ref.get("apiVersion", "")).startswith(f"{api.GROUP}/")


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _managed_keys(obj: Mapping[str, Any]) -> set[str]:
    return {k for k in _annotations(obj).get(api.ANN_MANAGED_KEYS, "").split(",") if k}


def _previous_keys(target: Mapping[str, Any]) -> set[str]:
    """The keys we wrote last time: all of them on a target written as Owner (our
    controller reference and no managed-keys record), else the managed-keys record."""
    refs = (target.get("metadata") or {}).get("ownerReferences") or []
    if api.ANN_MANAGED_KEYS not in _annotations(target) and any(_our_ref(r) for r in refs):
        return set(target.get("data") or {})
    return _managed_keys(target)


def rendering(spec: api.Spec, data: Mapping[str, str]) -> dict[str, str]:
    tpl = spec.target.template
    return render.render(tpl.format, data, key=tpl.data_key)


def ready(obj: Mapping[str, Any]) -> tuple[str, str]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status")), str(cond.get("reason"))
    return "Unknown", ""


class Oracle:
    def __init__(self, world: World) -> None:
        self.world = world
        self.violations: list[tuple[str, str]] = []  # (check, what happened)
        self.triggers: dict[str, list[Trigger]] = {}
        self.floor: dict[str, tuple[str, int]] = {}  # key -> (env, version) a sync must reach
        self.quiet: dict[tuple[str, str], int] = {}  # (env id, token) -> version at restart
        self.replaced: dict[str, list[tuple[str, float]]] = {}  # Secret -> (old token, when)
        self._deleted: list[str] = []
        self.rollout = RolloutOracle(world, self.violation)  # ``restart``: model_rollout.py
        self.merge = MergeOracle(world, self.violation)  # Merge and metadata: model_merge.py
        self.idle = IdleOracle(world, self.violation)  # ``idle``: model_quiet.py

    def violation(self, message: str) -> None:
        """Record a broken invariant; ``message`` starts with the check's name."""
        check = message.partition(":")[0]
        self.violations.append((check, f"t={self.world.clock.t:.3f}s: {message}"))

    # -- user actions -----------------------------------------------------------------

    def trigger(self, key: str, what: str, resource: str, rv: int) -> None:
        """Record an action after which ``key`` needs fresh data (see ``fresh``)."""
        self.quiet.clear()  # something changed: a full fetch may now be needed
        obj = self.world.server.get(HSEC, NS, key.partition("/")[2])
        if obj is None:
            return
        env = api.parse_spec(obj).environment_id
        required = self.world.himitsu.version_at(env, self.world.clock.t - FRESH)
        self.triggers.setdefault(key, []).append(Trigger(
            what, self.world.clock.t, env, required, resource, rv))
        self.floor[key] = (env, required)

    def token_replaced(self, secret: str, old: str) -> None:
        """The token in ``secret`` was ``old`` until now: the operator may send it for up to
        its token cache's TTL (kube.TOKEN_TTL), and Himitsu's refusals of it count."""
        self.replaced.setdefault(secret, []).append((old, self.world.clock.t))

    def touched(self) -> None:
        """An action that may legitimately need a full fetch without needing fresh data."""
        self.quiet.clear()

    def delivered(self, change: Change) -> None:
        for triggers in self.triggers.values():
            for trig in triggers:
                if trig.resource == change.resource and change.rv >= trig.rv:
                    trig.seen = True

    def restarting(self) -> None:
        """The new process lists everything: every action is seen. Record which sources
        are in sync, for ``quiet``."""
        for triggers in self.triggers.values():
            for trig in triggers:
                trig.seen = True
        self.quiet.clear()
        # A new process has not seen what the status says: a spec edited before its first
        # reconcile may name another token, so it asks (a watch open on a wake ends here).
        self.idle.close()
        self.rollout.process_started()
        sources: dict[tuple[str, str], bool] = {}
        for obj in self.world.server.objects_of(HSEC):
            spec = api.parse_spec(obj)
            token = self._token(spec)
            key = f"{NS}/{obj['metadata']['name']}"
            in_sync = not self.triggers.get(key) and self.sync_problem(obj, strict=True) is None
            source = (spec.environment_id, token)
            sources[source] = sources.get(source, True) and in_sync
        for (env, token), in_sync in sources.items():
            if in_sync:
                self.quiet[(env, token)] = self.world.himitsu.version(env)

    def _token(self, spec: api.Spec) -> str:
        secret = self.world.server.get(SECRET, NS, spec.auth_secret_name) or {}
        return base64.b64decode((secret.get("data") or {}).get(spec.auth_secret_key, "")).decode()

    # -- what the operator does -------------------------------------------------------

    def reconcile_started(self, key: str) -> None:
        self._deleted = []

    def reconcile_ended(self, key: str) -> None:
        for name in self._deleted:
            if self.world.server.get(SECRET, NS, name) is None:
                self.violation(f"removal: reconcile of {key} deleted target {name!r} and "
                               "ended without re-creating it")
        self._deleted = []

    def answered(self, request: Request) -> None:
        self.idle.answered(request)
        version = self.quiet.get((request.env, request.token))
        if request.status == 200 and version is not None and \
                self.world.himitsu.version(request.env) == version:
            self.violation("quiet: a full fetch (200) after a restart although every target "
                           f"of the source was in sync at version {version} "
                           f"(If-None-Match: {request.if_none_match})")

    def faulted(self) -> None:
        self.rollout.fault()

    def before_write(self, method: str, resource: str, namespace: str, name: str,
                     body: Mapping[str, Any] | None) -> None:
        if resource == SECRET:
            self.merge.before_write(method, name, body)
        self.idle.before_write(method, resource, name)
        if resource == DEPLOY:
            self.rollout.patching(body)
        if resource == HSEC:  # a patch of status.rolloutRestarts alone reports no sync
            self._prior_status = _sync_status(self.world.server.get(HSEC, namespace, name))
        if resource != SECRET or method not in ("PUT", "DELETE"):
            return
        prior = self.world.server.get(SECRET, namespace, name)
        if prior is None:
            return
        key, spec = self._current()
        if method == "DELETE":
            refs = (prior.get("metadata") or {}).get("ownerReferences") or []
            uid = ((self.world.current_obj or {}).get("metadata") or {}).get("uid")
            mine = _annotations(prior).get(api.ANN_OWNED_BY) == key.partition("/")[2] or any(
                _our_ref(r) and r.get("uid") == uid for r in refs)
            if not (is_ours(prior) and mine):
                self.violation(f"foreign: reconcile of {key} deleted Secret {name!r}, which "
                               "is not its own target")
            if spec is None or name == spec.target.name:  # not an earlier target released
                self._deleted.append(name)
            return
        if is_ours(prior):
            return
        uid = str(((self.world.current_obj or {}).get("metadata") or {}).get("uid", ""))
        if spec is not None and spec.target.name == name and self.merge.created_for.get(
                str((prior.get("metadata") or {}).get("uid", ""))) == uid:
            return  # its own target, created for it, that lost our label: relabelled in place
        merge = spec is not None and spec.target.creation_policy == "Merge" \
            and spec.target.name == name
        if not merge:
            self.violation(f"foreign: reconcile of {key} wrote Secret {name!r}, which is not ours")
            return
        written = body or {}
        data, old = written.get("data") or {}, prior.get("data") or {}
        kept = all(data.get(k) == v for k, v in old.items() if k not in _managed_keys(prior))
        # What the target's record says this HimitsuSecret's template applied is its own
        # to change or remove (issue 21 item 4), even on a target that lost our label.
        mine = _annotations(prior).get(api.ANN_OWNED_BY) == key.partition("/")[2]

        def applied(record: str) -> set[str]:
            return {k for k in _annotations(prior).get(record, "").split(",") if k and mine}

        meta_kept = all(_labels(written).get(k) == v for k, v in _labels(prior).items()
                        if k not in applied(api.ANN_TEMPLATE_LABELS)) and all(
            _annotations(written).get(k) == v for k, v in _annotations(prior).items()
            if not k.startswith(f"{api.GROUP}/")
            and k not in applied(api.ANN_TEMPLATE_ANNOTATIONS))
        if not (kept and meta_kept):
            self.violation(f"foreign: reconcile of {key} changed foreign keys or metadata of "
                           f"Merge target {name!r}")

    def after_write(self, method: str, resource: str, namespace: str, name: str,
                    stored: dict[str, Any] | None) -> None:
        self.idle.after_write(method, resource, name, stored)
        key, spec = self._current()
        if resource == SECRET:
            self.merge.after_write(method, name, stored)
        if resource == DEPLOY and method == "PATCH":
            self.rollout.workload_patched(name)
        elif resource == SECRET and method in ("POST", "PUT") and stored is not None:
            self.rollout.target_written(name, method)
        if stored is None or spec is None:
            return
        if resource == SECRET and method in ("POST", "PUT") and name == spec.target.name:
            self._check_rendered(key, spec, stored)  # (not an earlier target released)
        elif resource == HSEC and ready(stored) == ("True", "Synced") and \
                _sync_status(stored) != getattr(self, "_prior_status", None):
            version = int((stored.get("status") or {}).get("configVersion", -1))
            self._check_fresh(key, spec, version, "reported Synced at", clear=True)

    def _current(self) -> tuple[str, api.Spec | None]:
        key = self.world.current or "?"
        try:
            return key, api.parse_spec(self.world.current_obj or {})
        except api.InvalidSpec:
            return key, None

    def _check_rendered(self, key: str, spec: api.Spec, stored: Mapping[str, Any]) -> None:
        ann = _annotations(stored)
        name = stored["metadata"]["name"]
        version = int(ann.get(api.ANN_CONFIG_VERSION, "-1"))
        env = ann.get(api.ANN_ENVIRONMENT_ID, "")
        if env not in self.world.himitsu.history or not \
                0 <= version <= self.world.himitsu.version(env):
            self.violation(f"rendered: {key} wrote {name!r} at unknown version {version}")
            return
        expected = rendering(spec, self.world.himitsu.data(env, version))
        data = stored.get("data") or {}
        ours = data if spec.target.creation_policy == "Owner" else {
            k: data.get(k) for k in _managed_keys(stored)}
        if ours != expected:
            self.violation(f"rendered: {key} wrote {name!r} with keys {sorted(ours)}, not the "
                           f"rendering of version {version} (keys {sorted(expected)})")
        self._check_fresh(key, spec, version, f"wrote {name!r} at", clear=False)

    def _check_fresh(self, key: str, spec: api.Spec, version: int, did: str, *,
                     clear: bool) -> None:
        pending = self.triggers.get(key, [])
        for trig in [t for t in pending if t.seen]:
            if self._refusing(spec, since=trig.at):
                continue  # from memory, the action still pending: the next answer must be fresh
            if trig.env == spec.environment_id and version < trig.required:
                self.violation(
                    f"fresh: {key} {did} version {version} after '{trig.what}' at "
                    f"{trig.at:.3f}s, when Himitsu had been at version {trig.required} for "
                    f"{FRESH:g}s or more")
            if clear:
                pending.remove(trig)

    def _refusing(self, spec: api.Spec, *, since: float) -> bool:
        """Himitsu refuses this source now, for this token: its budget (or the IP's) ran
        short in the current window (the operator's own pacing holds requests back then),
        or its last answer to this source, given after the action at ``since`` and within
        a window of now, was a 429 or a 5xx. Meanwhile docs/syncing.md lets a first sync or a
        repair write what the operator holds in memory, and a timed poll or a force-sync
        wait (Ready may say the polls are overdue); it asks again as soon as it may."""
        himitsu, now, token = self.world.himitsu, self.world.clock.t, self._token(spec)
        if now < himitsu.short_until.get(token, 0.0) or now < himitsu.short_until.get("", 0.0):
            return True
        tokens = {token} | {old for old, at in self.replaced.get(spec.auth_secret_name, [])
                            if now - at <= TOKEN_TTL}  # a replaced token still cached
        answers = [r for r in himitsu.requests
                   if r.env == spec.environment_id and r.token in tokens]
        if not answers:
            return False
        last = answers[-1]
        # A 5xx holds the source for a second (polls.FAILURE_HOLD, the poller rule): one
        # answered just before the action refuses it too.
        held = FAILURE_HOLD if last.status >= 500 else 0.0
        return (last.at >= since - held and now - last.at <= WINDOW
                and (last.status == 429 or last.status >= 500))

    # -- the states a quiet period must end in ---------------------------------------------

    def sync_problem(self, obj: Mapping[str, Any], *, strict: bool = False) -> str | None:
        """None when ``obj``'s target holds what it should and its status says so; else
        what is wrong. A HimitsuSecret that cannot be synced must say so (Ready=False,
        with the reason the situation calls for). ``strict``: only a target holding
        Himitsu's current data will do."""
        name = obj["metadata"]["name"]
        spec = api.parse_spec(obj)
        policy = spec.target.creation_policy
        target = self.world.server.get(SECRET, NS, spec.target.name)
        status = obj.get("status") or {}
        state = ready(obj)
        env = spec.environment_id
        version = self.world.himitsu.version(env)
        # refreshInterval 0 syncs once; any other promises data no older than one interval,
        # which a quiet period shorter than the interval (an hourly poll: settle waits at
        # most 400 s) does not reach: the version Himitsu had an interval ago will do.
        oldest = 0 if spec.refresh_interval <= 0 else self.world.himitsu.version_at(
            env, self.world.clock.t - spec.refresh_interval)
        if target is not None and not strict and oldest < version:
            held = int(_annotations(target).get(api.ANN_CONFIG_VERSION, "-1"))
            floor = self.floor.get(f"{NS}/{name}")
            if oldest <= held <= version and (
                    floor is None or floor[0] != env or held >= floor[1]):
                version = held
        rendered = rendering(spec, self.world.himitsu.data(env, version))
        expected_failure = self._failure_expected(spec, target, rendered)
        if self.merge.refusal(obj, spec, target):
            reasons = {"TargetConflict"} | (expected_failure or (set(), ""))[0]
            expected_failure = reasons, "the target was not created for it, nor consents"
        shared = any(api.parse_spec(o).target.name == spec.target.name
                     and o["metadata"]["name"] != name
                     for o in self.world.server.objects_of(HSEC))
        if shared and state == ("False", "TargetConflict") and not strict:
            return None  # two HimitsuSecrets name it: one of them holds it
        if expected_failure is not None:
            if strict:
                return "cannot be synced"
            reasons, why = expected_failure
            return None if state[0] == "False" and state[1] in reasons else \
                f"{name}: {why}; Ready is {state}"
        problems = []
        if target is None:
            return f"{name}: target {spec.target.name!r} missing; Ready is {state}"
        data = target.get("data") or {}
        ann, labels = _annotations(target), _labels(target)
        ours = data if policy == "Owner" else {k: data.get(k) for k in _managed_keys(target)}
        if ours != rendered:
            problems.append(f"data is not the rendering of version {version} "
                            f"(keys {sorted(ours)} vs {sorted(rendered)})")
        if ann.get(api.ANN_CONFIG_VERSION) != str(version):
            problems.append(f"config-version {ann.get(api.ANN_CONFIG_VERSION)} != {version}")
        if target.get("type", "Opaque") != spec.target.type:
            problems.append(f"type {target.get('type')} != {spec.target.type}")
        if labels.get(api.LABEL_MANAGED) != "true":
            problems.append("label himitsu.io/managed missing")
        # Its template metadata: the ``template`` check (model_merge.py).
        if ann.get(api.ANN_OWNED_BY) != name or ann.get(api.ANN_SOURCE) != spec.source_hash():
            problems.append("owned-by or source-hash annotation wrong")
        refs = (target.get("metadata") or {}).get("ownerReferences") or []
        has_ref = any(_our_ref(r) and r.get("uid") == obj["metadata"]["uid"] for r in refs)
        if has_ref != (policy == "Owner"):
            problems.append(f"controller reference {'missing' if not has_ref else 'left'}")
        if state != ("True", "Synced") or status.get("configVersion") != version or \
                status.get("observedGeneration") != obj["metadata"]["generation"] or \
                status.get("lastForceSync") != api.force_sync_value(obj):
            problems.append(f"status not in step: Ready {state}, configVersion "
                            f"{status.get('configVersion')}, observedGeneration "
                            f"{status.get('observedGeneration')}")
        return f"{name}: " + "; ".join(problems) if problems else None

    @staticmethod
    def _failure_expected(
        spec: api.Spec, target: Mapping[str, Any] | None, rendered: Mapping[str, str],
    ) -> tuple[set[str], str] | None:
        """The Ready=False reasons a HimitsuSecret that cannot be synced may give (any
        problem it has may be the one reported), and why it cannot; None when it can."""
        policy = spec.target.creation_policy
        data = (target or {}).get("data") or {}
        reasons: dict[str, str] = {}
        if target is not None and not is_ours(target) and (
                policy == "Owner" or set(rendered) & set(data)):
            reasons["TargetConflict"] = f"target {spec.target.name!r} is not ours"
        elif target is not None and policy == "Merge" and \
                set(rendered) & (set(data) - _previous_keys(target)):
            reasons["TargetConflict"] = "Merge keys collide with foreign keys"
        if target is not None and policy == "Merge" and target.get("type") != spec.target.type:
            reasons["InvalidSpec"] = "a Merge target of another type"
        foreign = {} if target is None or policy == "Owner" else {
            k: v for k, v in data.items() if k not in _previous_keys(target)}
        wanted = {"metadata": {"name": spec.target.name}, "type": spec.target.type,
                  "data": {**foreign, **rendered}}
        if secret_errors(wanted):
            why = f"type {spec.target.type} cannot hold its data"
            reasons.setdefault("InvalidSpec", why)
            reasons.setdefault("WriteFailure", why)
        if not reasons:
            return None
        return set(reasons), "; ".join(sorted(set(reasons.values())))

    def wake_problems(self) -> list[str]:
        """``wake``: HimitsuSecrets the process knows with refreshInterval > 0 and no timely
        wake in its queue (an object whose latest change is still on its way through the
        informer is judged once it has arrived)."""
        process = self.world.process
        assert process is not None
        now = self.world.clock.epoch()
        in_flight = {f"{NS}/{(c.new or c.old or {})['metadata']['name']}"
                     for feed in process.feeds if feed.resource == HSEC
                     for _, _, c in feed.pending}
        horizon = self.world.himitsu.horizon + (now - self.world.clock.t)  # as epoch
        problems = []
        for obj in process.hsecs.store.list():
            key = f"{NS}/{obj['metadata']['name']}"
            if key in in_flight:
                continue
            try:
                interval = api.parse_spec(obj).refresh_interval
            except api.InvalidSpec:
                continue
            if interval <= 0:
                continue
            wake = process.wake_of(key)
            # Retry-After is in whole seconds, counted from Himitsu's answer.
            bound = max(interval, horizon - now + 1.0) + WAKE_SLACK
            last = next((f"{r} at {t:.3f}s" for t, k, r in reversed(self.world.results)
                         if k == key), "none")
            if wake is None:
                problems.append(f"wake: {key} (every {interval:g}s) has no wake at all: it "
                                f"will never be polled again (last reconcile: {last})")
            elif wake - now > bound:
                problems.append(f"wake: {key} (every {interval:g}s) wakes in "
                                f"{wake - now:.1f}s, more than {bound:.1f}s ahead "
                                f"(last reconcile: {last})")
        return problems


def _sync_status(obj: Mapping[str, Any] | None) -> dict[str, Any]:
    """A HimitsuSecret's status but the rollout entries (``sync.restarts`` patches them)."""
    status = dict((obj or {}).get("status") or {})
    status.pop("rolloutRestarts", None)
    return status
