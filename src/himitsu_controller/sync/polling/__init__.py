"""Polling Himitsu: shared conditional polls, pacing, the poll schedule and lag."""
