"""Exports of mmcomp-eval tasks for other harnesses: ``mmcomp-eval export lm-eval`` (:mod:`.lm_eval`)."""
