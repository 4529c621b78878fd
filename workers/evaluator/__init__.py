"""The evaluator worker: held-out metrics, task suites and an optional judge, into eval_result."""
