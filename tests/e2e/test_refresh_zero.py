"""refreshInterval 0 syncs once and then stops polling; under 1s it is refused."""

from __future__ import annotations

import pytest

from .harness import Harness
from .kubehelp import ApiError, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("default_operator")]

SENTINEL_POLLS = 4


def test_refresh_interval_zero_syncs_once_and_stops_polling(h: Harness, ns: str) -> None:
    once = h.sync(ns, "API_KEY", name="once", target="once-secrets", refresh="0")
    h.wait_data(ns, once.target, once.values)
    # A sentinel polling every second proves time passes with the operator at work.
    sentinel = h.sync(ns, "API_KEY", name="sentinel", target="sentinel-secrets",
                      refresh="1s", auth_name="sentinel-token")
    mark = h.standin.mark(sentinel.env)

    wait_for(lambda: h.standin.count(sentinel.env, after=mark) >= SENTINEL_POLLS, timeout=60,
             what=f"{SENTINEL_POLLS} polls of the sentinel")

    seen = [(r["status"], r["if_none_match"]) for r in h.standin.requests(once.env)]
    assert len(seen) == 1, f"refreshInterval 0 kept polling: {seen}"
    h.wait_ready(ns, once.name)


def test_a_sub_second_refresh_interval_is_refused_at_admission(h: Harness, ns: str) -> None:
    """The CRD's CEL rule, on the real apiserver: a sub-second cadence would poll on the
    requeue floor, a Himitsu request and a status patch every ~0.1 s."""
    env, _ = h.environment("API_KEY")
    for refresh in ("500ms", "0.5s"):
        with pytest.raises(ApiError) as refused:
            h.hsec(ns, "too-fast", env, target="fast-secrets", refresh=refresh)
        assert refused.value.status == 422, refused.value
        assert "refreshInterval must be 0 (sync once) or at least 1s" in refused.value.message
    for refresh in ("1s", "0ms"):  # the edges stay admitted
        h.hsec(ns, f"edge-{refresh}", env, target=f"edge-{refresh}-secrets", refresh=refresh)
