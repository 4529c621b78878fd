"""Which method and settings a cycle trains with, from the whole signal the route has.

The signal, per kind (usable examples, exact-deduplicated by prompt):
  * edits: the user rewrote the answer: the best signal, the user's own answer;
  * thumbs up: an answer the user accepted as it was;
  * regenerate pairs: the user threw an answer away and kept the next one;
  * thumbs down: an answer the user rejected, with nothing better to learn from.
What can teach is an answer users wanted: edits, thumbs-up answers and the kept side of
regenerate pairs ("desirable"). A set with none is never trained, and thumbs down alone never
starts a cycle: a model cannot learn what to say from "not that" alone.

The rule (unless the policy pins a method; docs/loop.md says why each case maps as it does):
  * regenerate pairs are most of what can teach (at least MIN_PAIRS, and no fewer than the
    edits and thumbs-up answers together) -> ORPO on the pairs, the edit pairs included: its
    SFT term learns the chosen answers and its odds-ratio term pushes the thrown-away ones down,
    in one run without a reference model;
  * otherwise -> SFT on every desirable answer: the edited texts and the thumbs-up answers.
    At the sizes a cycle trains on (tens to hundreds of examples) imitating what users wanted
    is the signal that moves a small model's behaviour; the rejected answers add nothing SFT
    could use, and a preference or KTO loss on a few dozen examples moves it far less.
A forget cycle retrains the tainted prod's method (like for like, without the forgotten rows).

Settings are chosen for LoRA and the run's length (`hyperparameters`), then checked: a short
sweep over SETTINGS_LADDER, each run scored on held-out data against what the route serves now,
the best with a gain kept (app/loop/steps.py `_sweep`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from app.datasets.methods import Method
from app.training.methods import Hyperparameters

# Regenerate pairs below this count never make the cycle a preference run.
MIN_PAIRS = 8
# LoRA's learning rate for a short run (a small set's MIN_STEPS to MAX_STEPS_SMALL optimiser
# steps), per method. A LoRA adapter's best rate is about ten times a full fine-tune's, and higher
# still for runs under a hundred steps; preference losses take smaller steps than imitation.
SHORT_LR: dict[str, float] = {"sft": 2e-3, "orpo": 1e-3, "dpo": 5e-4, "simpo": 5e-4, "kto": 5e-4}
BATCH = 8  # sequences per optimiser step for a small set
EPOCHS_SMALL = 3
MIN_STEPS, MAX_STEPS_SMALL = 8, 60
# The settings sweep of a cycle (app/loop/steps.py `_sweep`): each entry scales the learning rate
# and the number of steps of the rule's setting; the next is tried while no setting gained or the
# best still passes a suite under offline.SWEEP_UNTIL_PASS_RATE.
SETTINGS_LADDER: tuple[tuple[float, float], ...] = ((1.0, 1.0), (2.5, 1.5))


@dataclass(frozen=True)
class SignalCounts:
    """Usable examples per signal (exact-deduplicated by prompt)."""

    edits: int = 0
    thumbs_up: int = 0
    thumbs_down: int = 0
    regen_pairs: int = 0
    pairs: int = 0  # every preference pair: regenerate pairs and edit pairs

    @property
    def desirable(self) -> int:
        """Examples with an answer users wanted: what can teach."""
        return self.edits + self.thumbs_up + self.regen_pairs

    def as_dict(self) -> dict[str, int]:
        """The counts as a plain dict (with the desirable total)."""
        return asdict(self) | {"desirable": self.desirable}


class NothingToTeach(ValueError):
    """The signal holds no answer users wanted: training on it cannot help."""


def choose_method(
    counts: SignalCounts,
    *,
    pinned: str | None = None,
    memory_tight: bool = False,
    trigger: str = "volume",
    prod_method: str | None = None,
) -> tuple[Method, str]:
    """The method a cycle trains with, from the counts of its snapshot window, and why."""
    c = counts
    if c.desirable == 0:
        raise NothingToTeach(
            f"no answer users wanted in the window ({c.thumbs_down} thumbs down, no edits,"
            " thumbs up or regenerate pairs): nothing to learn from"
        )
    if pinned:
        return pinned, f"pinned by the policy ({pinned})"  # type: ignore[return-value]
    if trigger == "forget" and prod_method:
        return (
            prod_method,  # type: ignore[return-value]
            f"forget: retrain the tainted prod's method ({prod_method}) without the forgotten rows",
        )
    shown = (
        f"{c.edits} edits, {c.thumbs_up} thumbs up, {c.regen_pairs} regenerate pairs,"
        f" {c.thumbs_down} thumbs down"
    )
    if c.regen_pairs >= MIN_PAIRS and c.regen_pairs >= c.edits + c.thumbs_up:
        name = "simpo" if memory_tight else "orpo"
        return name, f"{shown}: regenerate pairs lead: {name.upper()} on every pair"  # type: ignore[return-value]
    return "sft", f"{shown}: SFT on every answer users wanted (edits and thumbs up)"


def hyperparameters(
    method: str, n_train: int, overrides: dict[str, Any] | None = None, *, attempt: int = 0
) -> dict[str, Any]:
    """The settings a run of method on n_train examples gets (validated; only what is set).

    Small sets (what a cycle usually trains on): batch 8, three passes within 8-60 steps, the
    method's short-run LoRA rate, constant, no warmup. Larger sets: batch 16, fewer passes as
    they grow, a tenth of that rate with a cosine decay. `attempt` picks the entry of
    SETTINGS_LADDER; the policy's overrides win last.
    """
    n = max(int(n_train), 1)
    lr_scale, steps_scale = SETTINGS_LADDER[min(attempt, len(SETTINGS_LADDER) - 1)]
    hp: dict[str, Any]
    if n <= 400:
        batch = min(BATCH, max(n, 2 if method == "kto" else 1))  # KTO's KL term needs two
        steps = math.ceil(EPOCHS_SMALL * n / batch)
        steps = min(max(steps, MIN_STEPS), MAX_STEPS_SMALL)
        steps = max(1, round(steps * steps_scale))
        lr = SHORT_LR[method] * lr_scale
        hp = {
            "batch_size": batch,
            "grad_accum": 1,
            "max_steps": steps,
            "learning_rate": float(f"{lr:.3g}"),
            "lr_scheduler": "constant",
            "warmup": 0.0,
        }
    else:
        epochs = 2 if n < 10000 else 1
        lr = SHORT_LR[method] / 10 * lr_scale
        hp = {
            "batch_size": BATCH,
            "grad_accum": 2,
            "epochs": epochs * steps_scale,
            "learning_rate": float(f"{lr:.3g}"),
            "lr_scheduler": "cosine",
        }
    hp |= dict(overrides or {})
    model = Hyperparameters(**hp)
    model.check_method(method)
    return model.model_dump(exclude_unset=True)
