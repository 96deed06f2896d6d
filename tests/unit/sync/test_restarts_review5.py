"""Review 5 of de84e10 (a change after a failover opens its window only when every named
workload's record is the target's id): reproductions.

Each test is a strict xfail named after the guarantee it shows broken; it passes (XPASS,
which fails the suite) the day the fix lands: then drop the mark."""

from __future__ import annotations

from typing import Any

import pytest
from reconcile_world import NS, TARGET, World
from test_restarts_review4 import two_changes_an_interval_apart

WEB = {"kind": "Deployment", "name": "web"}
GHOST = {"kind": "Deployment", "name": "ghost"}  # named, not (yet) deployed
STRANGER = {"kind": "Deployment", "name": "stranger"}  # deployed, reads another Secret


def _failover_then_two_changes(named: list[dict[str, str]], setup: Any) -> World:
    world = World(rolloutRestartTargets=named, minRestartInterval="1m",
                  refreshInterval="10s")
    world.kube.add_workload(NS, "Deployment", "web", reads=TARGET)
    setup(world)
    world.sync(5)
    world.restart()
    world.clock.advance(30)
    two_changes_an_interval_apart(world)
    return world


# review5 (LOW, a regression of de84e10): a named workload missing or not reading the target
# blocked the marks; fixed: only the records read count.
@pytest.mark.parametrize("other", ["missing", "unreferencing"])
def test_changes_within_one_window_after_a_failover_are_one_restart_beside_a_workload_owing_nothing(
        other: str) -> None:
    """Item 3: several changes within the window are one restart with the last data."""
    def setup(world: World) -> None:
        if other == "unreferencing":
            world.kube.add_workload(NS, "Deployment", "stranger", reads="another-secret")
    world = _failover_then_two_changes(
        [WEB, GHOST if other == "missing" else STRANGER], setup)
    web = [at for _, _, name, at in world.kube.restarts if name == "web"]
    assert len(web) == 1, web
