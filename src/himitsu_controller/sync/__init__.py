"""The reconcile of a HimitsuSecret and its rules: the middle layer.

``reconciler`` decides, fetches, renders, writes and reports for one object; the rules
it applies each live in a module of their own (``tokens``, ``polls`` and ``schedule``
for when and how Himitsu is asked, ``targets`` and ``render`` for what is written,
``status`` for what is reported, ``allowlist`` for where a token may go). It reaches
the outside world only through ``ports`` (Kubernetes as ``Kube``, Himitsu as
``Fetcher``) and uses nothing of ``runtime/`` but its ``Result`` type, so every rule is
tested with fakes and no cluster.
"""
