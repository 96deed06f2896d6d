"""Carrying out the schedule's faults: each in a thread of its own, each bounded in time.

A fault is done, held for its seconds, then undone; its record (``Injected``) carries the
wall-clock times it actually began and ended. ``drain()`` waits for every fault begun,
so a quiet phase starts only once the last one is over.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from .records import Injected
from .rig import Replica, Rig
from .schedule import Fault

HIMITSU_FAULTS = {"himitsu-5xx": "error", "himitsu-429": "rate_limit",
                  "himitsu-slow": "delay", "himitsu-hang": "delay"}


class FaultRunner:
    def __init__(self, rig: Rig, *, env_ids: list[str], tokens: list[str],
                 bump: Callable[[], None], sink: Callable[[Injected], None],
                 log: Callable[[str], None]) -> None:
        self.rig, self.env_ids, self.tokens, self.bump = rig, env_ids, tokens, bump
        self.sink, self.log = sink, log
        self._threads: list[threading.Thread] = []
        self.abort = threading.Event()  # set: every fault held is undone now
        self.errors: list[str] = []

    def begin(self, fault: Fault) -> None:
        thread = threading.Thread(target=self._run, args=(fault,), daemon=True,
                                  name=f"fault-{fault.kind}")
        thread.start()
        self._threads.append(thread)

    def drain(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]

    def _run(self, fault: Fault) -> None:
        began = time.time()
        target = fault.target
        try:
            target = getattr(self, "_" + fault.kind.replace("-", "_"))(fault) or target
        except Exception as exc:
            self.errors.append(f"{fault.describe()}: {exc!r}")
            self.log(f"fault failed: {fault.describe()}: {exc!r}\n{traceback.format_exc()}")
        self.sink(Injected(began, time.time(), fault.kind, target))

    # -- control plane ---------------------------------------------------------------------
    def _apiserver_restart(self, fault: Fault) -> None:
        self.rig.local.stop_apiserver(grace=5.0)
        self.abort.wait(fault.seconds)
        self.rig.local.start_apiserver(timeout=120.0)

    def _etcd_pause(self, fault: Fault) -> None:
        self.rig.etcd_signal(signal.SIGSTOP)
        try:
            self.abort.wait(fault.seconds)
        finally:
            self.rig.etcd_signal(signal.SIGCONT)

    def _watch_expiry(self, fault: Fault) -> str:
        """Freeze the leader, restart the apiserver (its watches close unread), compact
        etcd: on SIGCONT its rewatch from an old resourceVersion gets 410."""
        leader = self.rig.leader()
        if leader is not None:
            self.rig.signal(leader, signal.SIGSTOP)
        try:
            assert self.rig.etcd is not None
            self.rig.local.stop_apiserver(grace=5.0)
            self.rig.etcd.compact(self.rig.etcd.revision())
            self.rig.local.start_apiserver(timeout=120.0)
            self.abort.wait(fault.seconds)
        finally:
            if leader is not None:
                self.rig.signal(leader, signal.SIGCONT)
        return f"leader {leader.name}" if leader else "no leader"

    # -- processes -------------------------------------------------------------------------
    def _leader_or_any(self) -> Replica:
        return self.rig.leader() or self.rig.replicas["a"]

    def _leader_sigkill(self, _fault: Fault) -> str:
        replica = self._leader_or_any()
        self.rig.signal(replica, signal.SIGKILL)
        return f"replica {replica.name}"

    def _leader_sigterm(self, _fault: Fault) -> str:
        replica = self._leader_or_any()
        self.rig.signal(replica, signal.SIGTERM)
        return f"replica {replica.name}"

    def _restart_mid_sync(self, _fault: Fault) -> str:
        replica = self._leader_or_any()
        self.bump()  # a wave of Himitsu changes: syncs in flight
        self.abort.wait(0.3)
        self.rig.signal(replica, signal.SIGTERM)
        return f"replica {replica.name}"

    # -- connections -----------------------------------------------------------------------
    def _conn_hang(self, fault: Fault) -> str:
        proxy = self.rig.replicas[fault.target].proxy
        proxy.freeze()
        try:
            self.abort.wait(fault.seconds)
        finally:
            proxy.thaw()
        return f"replica {fault.target}"

    def _conn_cut(self, fault: Fault) -> str:
        proxy = self.rig.replicas[fault.target].proxy
        proxy.freeze()
        try:
            self.abort.wait(fault.seconds)
        finally:
            proxy.cut()
        return f"replica {fault.target}"

    # -- Himitsu ---------------------------------------------------------------------------
    def _standin(self, method: str, path: str, body: Any = None) -> Any:
        assert self.rig.standin is not None
        return self.rig.standin.call(method, path, body)

    def _himitsu(self, fault: Fault) -> str:
        body: dict[str, Any] = {"kind": HIMITSU_FAULTS[fault.kind]}
        if fault.target.startswith("env-"):
            body["environment"] = self.env_ids[int(fault.target.removeprefix("env-"))]
        if fault.kind == "himitsu-5xx":
            body["status"] = int(fault.param("status", 503))
        elif fault.kind == "himitsu-429":
            body["retry_after"] = int(fault.param("retry_after", 5))
        else:
            body["seconds"] = fault.param("delay", 2.0)
        fault_id = self._standin("POST", "/faults", body)["id"]
        try:
            self.abort.wait(fault.seconds)
        finally:
            with contextlib.suppress(RuntimeError):
                self._standin("DELETE", f"/faults/{fault_id}")
        return fault.target

    _himitsu_5xx = _himitsu_429 = _himitsu_slow = _himitsu_hang = _himitsu

    def _token_revoke(self, fault: Fault) -> str:
        token = self.tokens[int(fault.target.removeprefix("token-")) % len(self.tokens)]
        self._standin("POST", "/tokens/revoke", {"token": token})
        try:
            self.abort.wait(fault.seconds)
        finally:
            self._standin("POST", "/tokens/restore", {"token": token})
        return fault.target
