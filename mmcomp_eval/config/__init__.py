"""Typed configuration read from users: task files (YAML -> frozen dataclasses) and
``--model-args`` / ``--gen-kwargs`` strings.
"""
