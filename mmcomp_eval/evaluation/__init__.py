"""Running tasks and recording what came out: ``evaluate`` (the entry point the CLI calls), task
preparation, the evaluator, aggregation over seeds, bootstrap intervals, the compositional gap,
results files, reports and the comparison of runs.
"""
