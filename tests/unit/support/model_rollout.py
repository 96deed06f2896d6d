"""The model's restart oracle (issue 22): the HimitsuSecrets of even slots ``h<slot>`` name
Deployment ``w<slot>``, whose pods read the target ``t<slot>`` (half of them: what the
model costs stays within its time budget, and the others prove nothing changes without).

The oracle keeps the data ``w<slot>``'s pods were last started with, computed from
Himitsu's history and the spec the target was last written with (``render``; the
``rendered`` check holds every write to it), never from the operator's record: when
``h<slot>`` is created (the workload is first named), what the target holds ("not ours"
for someone else's Secret, as a Merge target's first sync finds; none yet for a missing
target, or one h<slot>'s first sync creates: the pods start with what that write puts
there, issue 22 item 3), then the rendering at each restart. Checked (``restart``):

* a restart (a patch of the pod template) happens only while the target's rendering
  differs from what the pods have (so never for a 304, a version with the same bytes, a
  token rotation or a new process), except after the accepted trade (the target created
  anew), a change put back (fresh id) or a record another tool removed, and never within
  ``WINDOW`` of the workload's previous restart (one per window);
* while a restart is owed, the HimitsuSecret has a wake no later than the window after
  the change reached the Secret, or after the operator (re)started (a crash or a new
  leader: "at once"), never sooner than a window after the last restart; a Kubernetes
  fault since excuses it (its retries back off), and so does a target whose data is
  edited by hand (a restart would start the pods with the edit: it waits for the repair);
* after a quiet period, the pods of every Ready HimitsuSecret have its target's rendering.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from model_kube import HSEC, SECRET

from himitsu_controller import api
from himitsu_controller.sync.target import render

if TYPE_CHECKING:
    from model_world import World

NS = "apps"
WINDOW = "3s"  # the HimitsuSecrets' minRestartInterval
WINDOW_S = 3.0
SLACK = 1.0  # seconds: requests' latency between the write and the operator's clock read
NOT_OURS = {"": "not a rendering of this HimitsuSecret"}
PENDING = {"": "no target yet: the pods start with what the first write puts there"}


def workload(slot: int) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"w{slot}"},
            "spec": {"template": {"metadata": {}, "spec": {"containers": [
                {"name": "app", "image": "app", "envFrom": [{"secretRef": {"name": f"t{slot}"}}]},
            ]}}}}


def spec_fields(slot: int) -> dict[str, Any]:
    if slot % 2:
        return {}
    return {"rolloutRestartTargets": [{"kind": "Deployment", "name": f"w{slot}"}],
            "minRestartInterval": WINDOW}


class RolloutOracle:
    def __init__(self, world: World, violation: Callable[[str], None]) -> None:
        self.world = world
        self.violation = violation
        self.pods: dict[str, dict[str, str]] = {}  # h<slot> -> the rendering its pods have
        self.owed: dict[str, float] = {}  # h<slot> -> since when the target differs (sim s)
        self.excused: set[str] = set()  # h<slot> whose next restart may be a needless one
        self.restarted_at: dict[str, float] = {}
        self.restarts: dict[str, int] = {}  # h<slot> -> restarts of w<slot> seen
        self.unwritten: set[str] = set()  # h<slot> created, its target not yet written by it
        self.written_with: dict[str, api.Template] = {}  # h<slot> -> template of its last write
        self.started = 0.0  # when the current operator process started
        self.faulted = -1.0  # when a Kubernetes fault was last served
        self._patch: Mapping[str, Any] = {}

    def named(self, name: str) -> None:
        """``name`` is about to be created: its workload is named (kept if it was before:
        the workload's pods do not change with the HimitsuSecret), and its first write is
        yet to come (``target_written``)."""
        if int(name[1:]) % 2:
            return
        self.unwritten.add(name)
        if self.pods.get(name, PENDING) is PENDING:
            target = self.world.server.get(SECRET, NS, f"t{name[1:]}")
            self.pods[name] = PENDING if target is None else NOT_OURS

    def reset(self, name: str) -> None:
        """``name`` names its workload no more (its target moved): nothing is owed, and
        should it come back, bytes under another id may cost a restart (the trade)."""
        self.owed.pop(name, None)
        self.excused.add(name)

    def created_by_another(self, target: str) -> None:
        """Someone else created ``target`` anew (it was deleted): the trade, as for a target
        the operator creates anew, may cost one restart of pods that read the old one."""
        name = "h" + target.removeprefix("t")
        if self.pods.get(name, PENDING) is not PENDING:
            self.excused.add(name)

    def process_started(self) -> None:
        self.started = self.world.clock.t

    def record_dropped(self, workload_name: str) -> None:
        """Another tool removed w<slot>'s record: its pods' data is not known any more, so
        its next restart may be a needless one (never a lost one)."""
        self.excused.add("h" + workload_name.removeprefix("w"))

    def fault(self) -> None:
        self.faulted = self.world.clock.t

    def patching(self, body: Mapping[str, Any] | None) -> None:
        self._patch = body or {}

    def workload_patched(self, workload_name: str) -> None:
        name = "h" + workload_name.removeprefix("w")
        now, t = self.rendering(name), self.world.clock.t
        if "spec" not in self._patch:  # only a record: no restart
            return
        if name not in self.excused and self.pods.get(name) == now:
            self.violation(f"restart: {workload_name} restarted although its pods have the "
                           f"data its target {name}'s rendering holds (keys {sorted(now or {})})")
        # One per window, as the restartedAt stamps say (a patch lands a request's latency
        # after the operator stamped it).
        stamped = api.parse_time(str(self._patch["spec"]["template"]["metadata"][
            "annotations"][api.ANN_RESTARTED_AT]))
        at = t if stamped is None else stamped.timestamp() - self.world.clock.epoch() + t
        last = self.restarted_at.get(name)
        if last is not None and at - last < WINDOW_S - 1e-3:
            self.violation(f"restart: {workload_name} restarted {at - last:.3f} s after its "
                           f"previous restart, within minRestartInterval {WINDOW}")
        # New pods of a workload whose target is missing wait for it (envFrom, a volume):
        # they start with what the next write puts there.
        missing = self.world.server.get(SECRET, NS, f"t{name[1:]}") is None
        self.pods[name] = PENDING if missing else NOT_OURS if now is None else now
        self.restarted_at[name] = at
        self.restarts[name] = self.restarts.get(name, 0) + 1
        self.excused.discard(name)
        self.owed.pop(name, None)

    def target_written(self, target: str, method: str) -> None:
        name = "h" + target.removeprefix("t")
        mine = self.world.current == f"{NS}/{name}"
        if mine:  # the target holds this spec's rendering (the ``rendered`` check)
            with contextlib.suppress(api.InvalidSpec):
                self.written_with[name] = api.parse_spec(self.world.current_obj or {}
                                                         ).target.template
        first = name in self.unwritten and mine
        if first:
            self.unwritten.discard(name)
        was = self.pods.get(name)
        # The pods waited for a target, or this HimitsuSecret's first sync created it (its
        # workload gets its record without a restart: issue 22, item 3): the first one.
        if was is PENDING or (first and method == "POST"):
            now = self.rendering(name) if method == "POST" else None  # else someone else's
            self.pods[name] = NOT_OURS if now is None else now
            if was is not PENDING:  # they read an earlier t<slot>: the trade, at most
                self.excused.add(name)
        elif method == "POST":
            self.excused.add(name)  # the trade: a target created anew may cost a restart
        self._note(name)

    def _note(self, name: str) -> None:
        if name not in self.pods:
            return
        now = self.rendering(name)
        if now is None:  # no rendering of this HimitsuSecret's (gone, foreign): none owed
            return
        if now == self.pods[name]:
            if self.owed.pop(name, None) is not None:  # a change put back: bytes under a
                self.excused.add(name)  # fresh id (no record confirms a past value)
        else:
            self.owed.setdefault(name, self.world.clock.t)

    def due_problems(self) -> list[str]:
        """Every restart owed has its wake in time (see the module docstring)."""
        process, problems = self.world.process, []
        assert process is not None
        for name, since in list(self.owed.items()):
            if self.world.server.get(HSEC, NS, name) is None:
                del self.owed[name]  # one created again owes from its own first write
                continue
            rendering = self.rendering(name)
            if since <= self.faulted or process.hsecs.store.get(f"{NS}/{name}") is None or \
                    rendering is None:  # its target is someone else's now
                continue  # retries back off; an object the informer has not shown yet
            if not self._holds(name, rendering):
                continue  # edited by hand: a restart now would start pods with that edit
            limit = max(since + WINDOW_S, self.started,
                        self.restarted_at.get(name, -WINDOW_S) + WINDOW_S) + SLACK
            wake = process.wake_of(f"{NS}/{name}")
            at = None if wake is None else wake - self.world.clock.epoch() + self.world.clock.t
            if wake is None or (wake != 0.0 and at is not None and at > limit):
                problems.append(f"restart: {name} owes w{name[1:]} a restart since "
                                f"t={since:.3f}s, but its next wake is "
                                f"{'none' if at is None else f't={at:.3f}s'} (due by "
                                f"t={limit:.3f}s)")
        return problems

    def _holds(self, name: str, rendering: Mapping[str, str]) -> bool:
        """The target's data holds ``rendering`` (else a hand edit awaits its repair)."""
        data = (self.world.server.get(SECRET, NS, f"t{name[1:]}") or {}).get("data") or {}
        return all(data.get(k) == v for k, v in rendering.items())

    def rendering(self, name: str) -> dict[str, str] | None:
        """The rendering of Himitsu's data at the version the target's annotation names,
        when ``name`` wrote the target, with the template of that write: what the target
        holds (a format edit changes nothing until the target is rewritten)."""
        obj = self.world.server.get(HSEC, NS, name)
        if obj is None:
            return None
        try:
            spec = api.parse_spec(obj)
        except api.InvalidSpec:
            return None
        if not spec.rollout.targets or spec.target.name != f"t{name[1:]}":
            return None  # moved to another target (merge rules): it names no workload
        target = self.world.server.get(SECRET, NS, spec.target.name)
        ann = ((target or {}).get("metadata") or {}).get("annotations") or {}
        env, version = ann.get(api.ANN_ENVIRONMENT_ID), ann.get(api.ANN_CONFIG_VERSION, "")
        if env not in self.world.himitsu.history or not version.isdigit() or \
                int(version) > self.world.himitsu.version(env) or \
                ann.get(api.ANN_OWNED_BY) != name:  # another's, or a version edited by hand
            return None
        tpl = self.written_with.get(name, spec.target.template)
        try:
            return render.render(tpl.format, self.world.himitsu.data(env, int(version)),
                                 key=tpl.data_key)
        except render.RenderError:
            return None

    def settled_problems(self) -> list[str]:
        problems = []
        for obj in self.world.server.objects_of(HSEC):
            name = obj["metadata"]["name"]
            ready = [c for c in (obj.get("status") or {}).get("conditions") or []
                     if c.get("type") == "Ready" and c.get("status") == "True"]
            if not ready or not (obj["spec"].get("rolloutRestartTargets")):
                continue
            if self.pods.get(name, PENDING) is not PENDING and \
                    self.pods[name] != self.rendering(name):
                problems.append(f"restart: after a quiet period w{name[1:]}'s pods still have "
                                f"older data than {name}'s target")
        return problems
