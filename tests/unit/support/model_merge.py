"""Merge targets, consent, template metadata and renames in the model-based test.

The rules (``MergeRules``, mixed into ``SyncModel``): a HimitsuSecret moved to another
target or policy (a rename, or a successor on a Merge target once its writer is gone or
moved), template metadata edits, a foreign Secret carrying metadata of the template's
keys, and its owner giving or withdrawing consent (``himitsu.io/allow-merge-by``).

The oracle (``MergeOracle``) keeps its own record of who wrote what: every item (a data
key, a label, an annotation) an operator write added or changed, with the HimitsuSecret
(uid) it wrote for, and which HimitsuSecret a Secret was created for (a creation fact: lost
once another HimitsuSecret writes it).
Its checks, named in ``MERGE_CHECKS``:

* ``untouched``: no operator write removes or changes an item someone else wrote (an
  Owner write's data aside, into a Secret created for its HimitsuSecret: Owner never
  adopts another; an operator stamp, or a key written for another HimitsuSecret, may be
  overwritten);
* ``consent``: a Merge into a Secret not created for its HimitsuSecret adds or changes
  nothing unless the Secret names it (or ``*``) in allow-merge-by; an Owner HimitsuSecret
  whose existing target was not created for it is refused;
* ``template`` (after a quiet period): an in-step target carries exactly the template's
  metadata: every template key (a Merge target's foreign key of that name aside), and no
  key the HimitsuSecret applied that its template no longer holds;
* ``renamed`` (after a quiet period): no Secret that no HimitsuSecret names, and that
  carries our label, still holds an item an in-step HimitsuSecret wrote last.
"""

from __future__ import annotations

import base64
import copy
from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import hypothesis.strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, rule
from model_kube import HSEC, SECRET

from himitsu_controller import api

if TYPE_CHECKING:
    from model_checks import Oracle
    from model_world import World

MERGE_CHECKS = frozenset({"untouched", "consent", "template", "renamed"})
NS = "apps"
Item = tuple[str, str]  # (section: data, labels or annotations; key)
SECTIONS = ("data", "labels", "annotations")


def items(obj: Mapping[str, Any] | None) -> dict[Item, str]:
    if not obj:
        return {}
    meta = obj.get("metadata") or {}
    maps = {"data": obj.get("data") or {}, "labels": meta.get("labels") or {},
            "annotations": meta.get("annotations") or {}}
    return {(section, k): str(v) for section in SECTIONS for k, v in maps[section].items()}


def _uid(obj: Mapping[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid", ""))


def consents(secret: Mapping[str, Any], name: str) -> bool:
    raw = ((secret.get("metadata") or {}).get("annotations") or {}).get(
        api.ANN_ALLOW_MERGE_BY, "")
    return bool({n.strip() for n in raw.split(",")} & {"*", name})


class MergeOracle:
    def __init__(self, world: World, violation: Callable[[str], None]) -> None:
        self.world = world
        self.violation = violation
        self.written: dict[str, dict[Item, str]] = {}  # Secret uid -> item -> HimitsuSecret uid
        self.created_for: dict[str, str] = {}  # Secret uid -> HimitsuSecret uid
        self.last_writer: dict[str, str] = {}  # Secret uid -> HimitsuSecret uid
        self._prior: dict[str, Any] | None = None
        self._recreating: dict[str, dict[str, Any]] = {}  # name -> the Secret deleted

    def _writer(self) -> tuple[str, str, api.Spec | None]:
        obj = self.world.current_obj or {}
        try:
            spec = api.parse_spec(obj)
        except api.InvalidSpec:
            spec = None
        return _uid(obj), str((obj.get("metadata") or {}).get("name", "")), spec

    # -- as the operator writes ---------------------------------------------------------

    def before_write(self, method: str, name: str, body: Mapping[str, Any] | None) -> None:
        prior = self.world.server.get(SECRET, NS, name)
        self._prior = prior
        uid, hname, spec = self._writer()
        if method == "DELETE" and prior is not None and spec is not None \
                and name == spec.target.name:
            self._recreating[name] = prior  # a type change: the create must keep its metadata
        elif method == "POST" and name in self._recreating:
            self._prior = self._recreating.pop(name)  # its record carries over
            self._check_kept(name, self._prior, body or {}, uid, owner_data=True)
        elif method == "PUT" and prior is not None and spec is not None:
            owner = spec.target.creation_policy == "Owner"
            self._check_kept(name, prior, body or {}, uid,
                             owner_data=owner and self.created_for.get(_uid(prior)) == uid)
            if owner and name == spec.target.name and self.created_for.get(_uid(prior)) != uid:
                self.violation(f"consent: {hname} (Owner) wrote Secret {name!r}, which was "
                               "not created for it")
            elif not owner and self.created_for.get(_uid(prior)) != uid \
                    and not consents(prior, hname):
                after, before = items(body), items(prior)
                added = sorted(k for k, v in after.items() if before.get(k) != v)
                if added:
                    self.violation(f"consent: {hname} wrote {added[:3]} into Secret {name!r}, "
                                   "which does not consent to a Merge by it")

    def _check_kept(self, name: str, prior: Mapping[str, Any], body: Mapping[str, Any],
                    uid: str, *, owner_data: bool) -> None:
        spec = self._writer()[2]
        record = self.written.get(_uid(prior), {})
        after = items(body)
        template = {} if spec is None else {
            "labels": spec.target.template.labels,
            "annotations": spec.target.template.annotations}
        owner = spec is not None and spec.target.creation_policy == "Owner"
        for item, value in items(prior).items():
            section, key = item
            if record.get(item) == uid or (section == "data" and owner_data):
                continue
            by_operator = item in record
            if item not in after and not (by_operator and api.is_reserved_key(key)):
                self.violation(f"untouched: a write for {self._writer()[1]} removed {item} "
                               f"of Secret {name!r}, which it did not write")
            elif item in after and after[item] != value and not by_operator and not (
                    owner and key in template.get(section, {})):
                self.violation(f"untouched: a write for {self._writer()[1]} changed {item} "
                               f"of Secret {name!r}, which it did not write")

    def after_write(self, method: str, name: str, stored: Mapping[str, Any] | None) -> None:
        uid, _, spec = self._writer()
        prior, self._prior = self._prior, None
        if stored is None or spec is None or method not in ("POST", "PUT"):
            return
        secret_uid = _uid(stored)
        if prior is not None and _uid(prior) != secret_uid:  # recreated: the same Secret
            self.written[secret_uid] = dict(self.written.get(_uid(prior), {}))
        record = self.written.setdefault(secret_uid, {})
        before = items(prior)
        after = items(stored)
        for item in [i for i in record if i not in after]:
            del record[item]
        for item, value in after.items():
            if before.get(item) != value:
                record[item] = uid
        self.last_writer[secret_uid] = uid
        if name != spec.target.name:  # an earlier target released: nothing of it is ours
            self.created_for.pop(secret_uid, None)
        elif method == "POST":
            self.created_for[secret_uid] = uid
        elif self.created_for.get(secret_uid) not in (None, uid):
            del self.created_for[secret_uid]  # another's stamps now: not "created for" it

    # -- what a HimitsuSecret must say, and what a quiet period must end in ----------------

    def refusal(self, obj: Mapping[str, Any], spec: api.Spec,
                target: Mapping[str, Any] | None) -> bool:
        """Must this HimitsuSecret be refused: an Owner one for a target not created for
        it (Owner never adopts), a Merge one for want of the target's consent?"""
        if target is None or self.created_for.get(_uid(target)) == _uid(obj):
            return False
        return (spec.target.creation_policy == "Owner"
                or not consents(target, obj["metadata"]["name"]))

    def template_problem(self, obj: Mapping[str, Any], spec: api.Spec,
                         target: Mapping[str, Any]) -> str | None:
        uid, record = _uid(obj), self.written.get(_uid(target), {})
        have = items(target)
        owner = spec.target.creation_policy == "Owner"
        problems = []
        for section, want in (("labels", spec.target.template.labels),
                              ("annotations", spec.target.template.annotations)):
            for key, value in want.items():
                item = (section, key)
                if have.get(item) != value and (
                        owner or item not in have or record.get(item) == uid):
                    problems.append(f"template {section} key {key!r} missing")
            for (sec, key), writer in record.items():
                if sec == section and writer == uid and not api.is_reserved_key(key) \
                        and key not in want and (sec, key) in have:
                    problems.append(f"{section} key {key!r} removed from the template stays")
        return "; ".join(problems) or None

    def settled_problems(self, checks: frozenset[str]) -> list[str]:
        from model_checks import ready  # noqa: PLC0415 (model_checks imports this module)

        server = self.world.server
        in_step = {}
        for obj in server.objects_of(HSEC):
            status = obj.get("status") or {}
            if ready(obj) == ("True", "Synced") and \
                    status.get("observedGeneration") == obj["metadata"]["generation"]:
                in_step[_uid(obj)] = obj
        named = {api.parse_spec(o).target.name for o in server.objects_of(HSEC)}
        problems = []
        for obj in in_step.values():
            spec = api.parse_spec(obj)
            target = server.get(SECRET, NS, spec.target.name)
            problem = None if target is None else self.template_problem(obj, spec, target)
            if "template" in checks and problem is not None:
                problems.append(f"template: {obj['metadata']['name']}: {problem}")
        for secret in server.objects_of(SECRET):
            name, suid = secret["metadata"]["name"], _uid(secret)
            writer = self.last_writer.get(suid)
            # One that lost our label is out of the operator's sight (a label-selected
            # watch) and, without our controller reference, not its to touch ("foreign").
            unlabelled = (secret["metadata"].get("labels") or {}).get(api.LABEL_MANAGED) != "true"
            if "renamed" not in checks or name in named or writer not in in_step or unlabelled:
                continue
            left = sorted(i for i, w in self.written.get(suid, {}).items()
                          if w == writer and i in items(secret))
            if left:
                problems.append(f"renamed: Secret {name!r}, no HimitsuSecret's target, still "
                                f"holds {left[:3]} of {in_step[writer]['metadata']['name']}")
        return problems


LABEL_SETS = st.sampled_from([{"team": "a"}, {}, {"team": "b", "tier": "x"}])
ANNOTATION_SETS = st.sampled_from([{"example.com/note": "x"}, {},
                                   {"example.com/note": "y", "example.com/replicate-to": "ns"}])
CONSENT = st.sampled_from(["*", "h0,h1,h2,h3", "nobody", None])
SLOT = st.integers(0, 3)
POLICY = st.sampled_from(["Owner", "Merge", "Merge"])


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class MergeRules(RuleBasedStateMachine):
    """The rules; ``SyncModel`` supplies the world and the oracle."""

    slots = Bundle("slots")

    @property
    @abstractmethod
    def world(self) -> World: ...

    @property
    @abstractmethod
    def oracle(self) -> Oracle: ...

    def _edit_hsec(self, slot: int, edit: Callable[[dict[str, Any]], None]) -> None:
        obj = self.world.server.get(HSEC, NS, f"h{slot}")
        if obj is None:
            return
        spec = copy.deepcopy(obj["spec"])
        edit(spec)
        if spec == obj["spec"]:
            return
        obj["spec"] = spec
        self.world.server.update(HSEC, NS, f"h{slot}", obj)
        self._quietly()

    def _quietly(self) -> None:
        self.oracle.touched()
        self.world.run_until(self.world.clock.t)

    def _retarget(self, slot: int, to: int, policy: str) -> None:
        """h<slot>'s workload reads t<slot> (model_rollout.py): once the HimitsuSecret
        moves to another target, it names no workload (the restart oracle's rules hold
        for a HimitsuSecret on its own slot's target only)."""
        def edit(spec: dict[str, Any]) -> None:
            spec["target"].update(name=f"t{to}", creationPolicy=policy)
            spec.pop("rolloutRestartTargets", None)
            spec.pop("minRestartInterval", None)
        self.oracle.rollout.reset(f"h{slot}")
        self._edit_hsec(slot, edit)

    @rule(slot=slots, to=SLOT, policy=POLICY)
    def retarget(self, slot: int, to: int, policy: str) -> None:
        """target.name (and the policy) changes: a rename, or another's target."""
        self._retarget(slot, to, policy)

    @rule(gone=slots, heir=slots)
    def successor(self, gone: int, heir: int) -> None:
        """The writer of a Merge target is deleted and another Merge HimitsuSecret of
        another source takes the target over."""
        if gone == heir or self.world.server.get(HSEC, NS, f"h{heir}") is None:
            return
        if self.world.server.get(HSEC, NS, f"h{gone}") is not None:
            self.world.server.delete(HSEC, NS, f"h{gone}")
            self.oracle.triggers.pop(f"{NS}/h{gone}", None)
            self.oracle.floor.pop(f"{NS}/h{gone}", None)
            self._quietly()
        self._retarget(heir, gone, "Merge")

    @rule(slot=slots, labels=LABEL_SETS, annotations=ANNOTATION_SETS)
    def edit_template_metadata(self, slot: int, labels: dict[str, str],
                               annotations: dict[str, str]) -> None:
        def edit(spec: dict[str, Any]) -> None:
            spec["target"].setdefault("template", {}).update(
                labels=labels, annotations=annotations)
        self._edit_hsec(slot, edit)

    @rule(slot=SLOT, consent=CONSENT)
    def create_foreign_with_metadata(self, slot: int, consent: str | None) -> None:
        """Another team's Secret, with a label and an annotation of the template's keys."""
        if self.world.server.get(SECRET, NS, f"t{slot}") is not None:
            return
        annotations = {"example.com/note": "theirs"}
        if consent is not None:
            annotations[api.ANN_ALLOW_MERGE_BY] = consent
        self.world.server.create(SECRET, NS, {
            "metadata": {"name": f"t{slot}", "labels": {"team": "theirs"},
                         "annotations": annotations},
            "type": "Opaque", "data": {"their-key": b64("theirs")}})
        self.oracle.rollout.created_by_another(f"t{slot}")
        self._quietly()

    @rule(slot=SLOT, consent=CONSENT)
    def give_or_withdraw_consent(self, slot: int, consent: str | None) -> None:
        secret = self.world.server.get(SECRET, NS, f"t{slot}")
        if secret is None:
            return
        annotations = secret["metadata"].setdefault("annotations", {})
        if consent is None:
            annotations.pop(api.ANN_ALLOW_MERGE_BY, None)
        else:
            annotations[api.ANN_ALLOW_MERGE_BY] = consent
        self.world.server.update(SECRET, NS, f"t{slot}", secret)
        self._quietly()
