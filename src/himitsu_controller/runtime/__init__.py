"""A small, generic controller runtime in the spirit of client-go and controller-runtime.

Nothing under this package imports the Himitsu part: it could drive any reconciler.
"""
