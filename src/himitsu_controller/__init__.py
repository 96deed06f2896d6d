"""himitsu-controller: sync a Himitsu environment into a Kubernetes Secret and keep it current.

Three layers, arrows pointing down only (``make lint`` checks it): ``runtime`` is a small,
generic controller runtime (workqueue, informers, workers, leader election, metrics,
probes) that knows nothing of Himitsu; ``himitsu`` is the API client, which knows
nothing of Kubernetes; ``sync`` is the reconcile and its rules, reaching both worlds
only through ``sync.ports``. At the top, ``api`` is the model, ``kube`` the adapter that
implements the port, and ``cli`` the face that wires it all into the runtime.
"""

__version__ = "0.1.0"
