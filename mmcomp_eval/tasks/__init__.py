"""The stages a document passes through before it reaches a model: the task index, dataset
loaders, few-shot samplers, sandboxed prompt rendering, and the output types that build requests and parse answers.
"""
