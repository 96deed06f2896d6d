"""The model's restart oracle (issue 16): the HimitsuSecrets of even slots ``h<slot>`` name
Deployment ``w<slot>``, whose pods read the target ``t<slot>`` (half of them: what the
model costs stays within its time budget, and the others prove nothing changes without).

The oracle keeps the data ``w<slot>``'s pods were last started with: the rendering the
target held when the HimitsuSecret's rolloutRestarts entry was first recorded (the
documented baseline: an entry seen for the first time takes the data as the pods have
it; a new token changes nothing), unless its first sync changed a target that existed
(the pods have what it held before: a restart is owed), then the rendering at each
restart. Computed from Himitsu's history and the spec (``render``), never from the
operator's record. Checked:

* ``restart``: a restart (a patch of the Deployment) happens only while the target's
  rendering differs from what the pods have; after a quiet period, the pods of every
  Ready HimitsuSecret have its target's rendering (no restart owed is lost).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from model_kube import HSEC, SECRET

from himitsu_controller import api
from himitsu_controller.sync.target import render

if TYPE_CHECKING:
    from model_world import World

NS = "apps"
WINDOW = "3s"  # the HimitsuSecrets' minRestartInterval


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
        self.pods: dict[str, dict[str, str] | None] = {}  # h<slot> -> rendering; None: unknown
        self.before: dict[str, Any] = {}  # h<slot> -> its target's data before its first sync

    def reset(self, name: str) -> None:
        """A new HimitsuSecret in the slot, or a new token: the baseline is taken anew."""
        self.pods[name] = None
        self.before.pop(name, None)

    def secret_written(self, target: str, prior: Mapping[str, Any]) -> None:
        """An update or replacement of target ``t<slot>`` that existed, by its
        HimitsuSecret's first sync (no configVersion yet): what its pods read before."""
        name = "h" + target.removeprefix("t")
        obj = self.world.server.get(HSEC, NS, name)
        if obj is not None and self.pods.get(name) is None and \
                "configVersion" not in (obj.get("status") or {}):
            self.before.setdefault(name, prior.get("data") or {})

    def status_written(self, name: str, stored: Mapping[str, Any]) -> None:
        if self.pods.get(name) is None and (stored.get("status") or {}).get("rolloutRestarts"):
            # What the pods read before that first sync: no rendering of this source.
            target = self.world.server.get(SECRET, NS, f"t{name[1:]}") or {}
            changed = name in self.before and self.before[name] != (target.get("data") or {})
            self.pods[name] = {"": "before the first sync"} if changed else self.rendering(name)

    def restarted(self, workload_name: str) -> None:
        name = "h" + workload_name.removeprefix("w")
        now = self.rendering(name)
        before = self.pods.get(name)
        if before is not None and now == before:
            self.violation(f"restart: {workload_name} restarted although its pods have the "
                           f"data its target {name}'s rendering holds (keys {sorted(now or {})})")
        self.pods[name] = now

    def rendering(self, name: str) -> dict[str, str] | None:
        """The rendering of Himitsu's data at the version the target's annotation names."""
        obj = self.world.server.get(HSEC, NS, name)
        if obj is None:
            return None
        try:
            spec = api.parse_spec(obj)
        except api.InvalidSpec:
            return None
        target = self.world.server.get(SECRET, NS, spec.target.name)
        ann = ((target or {}).get("metadata") or {}).get("annotations") or {}
        env, version = ann.get(api.ANN_ENVIRONMENT_ID), ann.get(api.ANN_CONFIG_VERSION, "")
        if env not in self.world.himitsu.history or not version.isdigit():
            return None
        tpl = spec.target.template
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
            pods = self.pods.get(name)
            named = (obj.get("spec") or {}).get("rolloutRestartTargets")  # none: no one's
            if ready and named and pods is not None and pods != self.rendering(name):
                problems.append(f"restart: after a quiet period w{name[1:]}'s pods still have "
                                f"older data than {name}'s target")
        return problems
