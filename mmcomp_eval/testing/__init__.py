"""Helpers for tests and benchmarks that ship with the package (so plugins can test against the same models).

Nothing here is imported by the harness itself.
"""
