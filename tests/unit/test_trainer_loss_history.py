"""The trainer's progress keeps a bounded loss history spread over the whole run."""

from __future__ import annotations

from itertools import pairwise
from types import SimpleNamespace
from typing import Any

from workers.trainer.train import HISTORY_POINTS, Progress, progress_callback


def test_history_is_bounded_and_spans_the_run() -> None:
    seen: list[Progress] = []
    cb = progress_callback(lambda p: seen.append(p) and None)
    control = SimpleNamespace(should_training_stop=False)
    total = 3 * HISTORY_POINTS + 7
    for step in range(1, total + 1):
        state: Any = SimpleNamespace(global_step=step, max_steps=total, num_input_tokens_seen=0)
        cb.on_log(None, state, control, logs={"loss": 10.0 / step})
    cb.on_log(None, state, control, logs={"loss": float("nan")})  # not kept
    last = seen[-1].as_dict()
    history = last["loss_history"]
    assert len(seen[0].loss_history) == 1 and seen[0].loss_history == [[1, 10.0]]
    assert HISTORY_POINTS // 2 <= len(history) <= HISTORY_POINTS
    steps = [s for s, _ in history]
    assert steps == sorted(steps) and steps[0] <= 4 and steps[-1] >= total - 4
    assert len({b - a for a, b in pairwise(steps)}) == 1  # evenly spaced
    assert all(loss == 10.0 / s for s, loss in history)
    assert last["step"] == total and last["loss"] == 10.0 / total
