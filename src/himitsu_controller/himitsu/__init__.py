"""The Himitsu API client: one read (the runtime secrets endpoint), done safely.

The bottom layer beside ``runtime/``: it knows nothing of Kubernetes, of the reconcile
or of the controller runtime, so it can be tested (and reused) with ``responses`` alone.
``client`` holds the request, ``http`` the deadline-bounded transport, ``wire`` the
reading of answers (results and typed errors, envelope, ETag, rate-limit headers).
"""

from himitsu_controller.himitsu import client, wire
from himitsu_controller.himitsu.client import *  # noqa: F403 (the surface: client.__all__)
from himitsu_controller.himitsu.wire import *  # noqa: F403 (and wire.__all__)

__all__ = client.__all__ + wire.__all__
