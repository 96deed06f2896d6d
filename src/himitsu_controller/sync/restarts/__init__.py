"""Restarting the workloads that read a target when its data changes (issue 22)."""
