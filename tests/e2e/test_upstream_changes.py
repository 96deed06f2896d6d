"""Changes made in Himitsu reach the Secret at the next poll."""

from __future__ import annotations

import pytest

from himitsu_controller.sync.polling import schedule

from .harness import Harness
from .kubehelp import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]

REFRESH_SECONDS = 3.0
SLACK_SECONDS = 12.0  # scheduling on a busy 2-core machine, not a performance figure


def test_changed_value_reaches_the_secret_within_one_refresh_interval(h: Harness,
                                                                     ns: str) -> None:
    sync = h.sync(ns, "API_KEY", "DB_PASSWORD", refresh="3s")
    wait_for(lambda: h.standin.count(sync.env, status=304) >= 1, timeout=30,
             what="steady state (a poll answered 304)")

    changed = {**sync.values, "API_KEY": h.canary.value("rotated")}
    h.standin.set_secrets(sync.env, {"API_KEY": changed["API_KEY"]})

    h.wait_data(ns, sync.target, changed, timeout=REFRESH_SECONDS + SLACK_SECONDS)
    version = h.standin.info(sync.env)["configVersion"]
    wait_for(lambda: h.get_hsec(ns, sync.name)["status"]["configVersion"] == version,
             timeout=30, what=f"status.configVersion {version}")


def test_added_key_appears_in_the_secret(h: Harness, ns: str) -> None:
    sync = h.sync(ns, "API_KEY", refresh="3s")

    added = h.canary.values("NEW_FEATURE_FLAG")
    h.standin.set_secrets(sync.env, added)

    h.wait_data(ns, sync.target, {**sync.values, **added},
                timeout=REFRESH_SECONDS + SLACK_SECONDS)
    wait_for(lambda: h.get_hsec(ns, sync.name)["status"]["secretCount"] == 2, timeout=30,
             what="status.secretCount 2")


def test_a_himitsu_secret_created_right_after_a_change_gets_the_new_value(
        h: Harness, ns: str) -> None:
    # Another HimitsuSecret on the same source holds an answer from before the change,
    # and polls only hourly: the new one must not start from that answer.
    env, values = h.environment("API_KEY", "DB_PASSWORD")
    h.token_secret(ns, h.token_for(env))
    h.hsec(ns, "first", env, target="first-secrets", refresh="1h")
    h.wait_data(ns, "first-secrets", values)
    h.wait_answers_older_than(env, schedule.FRESH)  # no answer young enough to share
    changed = {**values, "API_KEY": h.canary.value("rotated")}
    h.standin.set_secrets(env, {"API_KEY": changed["API_KEY"]})

    h.hsec(ns, "second", env, target="second-secrets", refresh="1h")

    h.wait_data(ns, "second-secrets", changed, timeout=30)
    h.wait_ready(ns, "second")
