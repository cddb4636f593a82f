"""Fixtures that the tests and the benchmarks share: small real model folders (``models``) and
helpers for the stage processes they start (``procs``).

Part of the operations layer: it may import the stages, but only inside the functions that
need them, so importing it stays cheap.
"""
