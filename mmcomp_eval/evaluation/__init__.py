"""Running tasks and recording what came out: the evaluator, aggregation over seeds, bootstrap
intervals, the compositional gap, results files, reports and the comparison of runs.
"""
