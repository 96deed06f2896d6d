"""Informers: list (in pages) and watch into an indexed store of raw dicts."""
