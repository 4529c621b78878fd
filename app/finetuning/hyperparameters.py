"""OpenAI's hyperparameters to a training run's: "auto" is the autonomous loop's own choice.

The loop picks a run's settings from the method and the size of its training set
(`app.loop.method.hyperparameters`); a job's "auto" values are exactly that choice, and the
values a request sets replace the loop's: batch_size (examples per optimizer step, no gradient
accumulation), n_epochs (passes over the set instead of the loop's step count), beta, and
learning_rate_multiplier, which scales the loop's learning rate.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError

from app.core.errors import Unprocessable
from app.finetuning.schemas import SupervisedHyperparameters
from app.loop.method import hyperparameters as loop_settings
from app.training.methods import Hyperparameters


def resolve(
    method: str, n_train: int, given: SupervisedHyperparameters, *, seed: int, where: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the run's hyperparameters, only what is set; OpenAI's as resolved, all numbers)."""
    overrides: dict[str, Any] = {"seed": seed}
    if given.batch_size != "auto":
        overrides |= {"batch_size": given.batch_size, "grad_accum": 1}
    if given.n_epochs != "auto":
        overrides |= {"epochs": given.n_epochs, "max_steps": -1}
    beta = getattr(given, "beta", "auto")
    if beta != "auto":
        overrides["beta"] = beta
    multiplier = 1.0 if given.learning_rate_multiplier == "auto" else given.learning_rate_multiplier
    try:
        hp = loop_settings(method, n_train, overrides)
        hp["learning_rate"] = float(f"{hp['learning_rate'] * multiplier:.3g}")
        full = Hyperparameters(**hp)
        full.check_method(method)
    except (ValidationError, ValueError) as exc:
        raise Unprocessable(
            f"{where}: these settings make no valid {method} run ({_first(exc)})", param=where
        ) from exc
    batch = full.batch_size * full.grad_accum
    if given.n_epochs != "auto":
        epochs = int(given.n_epochs)
    elif full.max_steps > 0:
        epochs = max(1, round(full.max_steps * batch / max(n_train, 1)))
    else:
        epochs = max(1, math.ceil(full.epochs))
    shown: dict[str, Any] = {
        "batch_size": batch,
        "learning_rate_multiplier": multiplier,
        "n_epochs": epochs,
    }
    if method == "dpo":
        shown["beta"] = full.beta
    return hp, shown


def _first(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
    return str(exc)
