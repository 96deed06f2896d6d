"""himitsu-controller: sync a Himitsu environment into a Kubernetes Secret and keep it current.

Two layers, and the arrow points one way: ``runtime`` is a small, generic controller
runtime (workqueue, informers, workers, leader election, metrics, probes) that knows
nothing of Himitsu; the other modules are the Himitsu part that plugs into it.
"""

__version__ = "0.1.0"
