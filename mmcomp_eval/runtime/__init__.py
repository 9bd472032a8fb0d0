"""What keeps long runs safe on shared machines: the response store and the model wrapper that
answers from it, data-parallel processes, atomic file writes and the output-folder lock.
"""
