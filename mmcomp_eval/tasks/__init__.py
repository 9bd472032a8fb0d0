"""The stages a document passes through before it reaches a model: the task index, dataset
loaders, few-shot samplers, sandboxed prompt rendering, and parsing of answers.
"""
