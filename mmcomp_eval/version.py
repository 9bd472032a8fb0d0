"""The package version, in a module of its own so that any module can read it without importing
the package's ``__init__`` (which exposes ``evaluate`` and so sits above every other package)."""

__version__ = "0.1.0"
