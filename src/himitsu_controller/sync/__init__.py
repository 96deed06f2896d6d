"""The reconcile of a HimitsuSecret and its rules: the middle layer.

``reconciler`` runs the phases; each rule lives in a module of its own (``polling/``: when
and how Himitsu is asked; ``target/``: what is written; ``status``, ``wakes``, ``tokens``).
The outside world only through ``ports``; of ``runtime/`` only ``Result``.
"""
