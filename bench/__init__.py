"""Benchmarks of himitsu-controller: what a poll, a cold sync and a repair cost.

Why a package and not loose scripts: the measuring rig (control plane, stand-in,
operator process), the scenarios and the pure arithmetic (audit-log counting,
percentiles, the table) are separate concerns, and the pure part is unit-tested in
tests/unit/test_bench.py without a cluster. ``python bench/run.py`` (``make bench``) is
the entry point; bench/README.md explains every figure.

Modules, each depending only on those above it:
  figures    pure: percentiles, audit-log events, Prometheus text, /proc parsing
  report     pure: targets, PASS/MISS, the table, the JSON document
  kubeapi    admin access to the apiserver (thread-safe requests) and a watch thread
  procs      the stand-in and the operator as processes we start and stop by PID
  rig        everything wired together: cluster, RBAC, identities, fleets of objects
  scenarios  one function per scenario, returning figures
  cli        flags, scenario order, output
"""
