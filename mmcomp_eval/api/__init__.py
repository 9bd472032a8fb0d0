"""Abstract types shared by every stage: documents, model requests, metrics.

Nothing in ``api`` imports from the rest of the package, so every other
module may import from it without creating cycles.
"""
