"""Task suites of the evaluator and evaluation requests."""
