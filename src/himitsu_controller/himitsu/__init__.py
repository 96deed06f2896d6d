"""The Himitsu API client: one read (the runtime secrets endpoint), done safely.

The bottom layer beside ``runtime/``: it knows nothing of Kubernetes, of the reconcile
or of the controller runtime, so it can be tested (and reused) with ``responses`` alone.
``client`` holds the request and its typed errors, ``http`` the deadline-bounded
transport, ``wire`` the reading of answers (envelope, ETag, rate-limit headers).
"""

from himitsu_controller.himitsu.client import *  # noqa: F403 (the surface is client.__all__)
from himitsu_controller.himitsu.client import __all__ as __all__
