"""Which method and hyperparameters a cycle trains with, from the signal the route has.

The rule (the seed's table, unless the policy pins a method):
  * edits and regenerate pairs both -> ORPO: the pair view holds both signals (an edit is a
    pair: the edited text chosen over the original), and ORPO learns the chosen answers (its
    SFT term) and the preference (its odds-ratio term) in one run, without a reference model.
    SFT-then-DPO would need two runs stacked on one adapter, which the trainer does not do
    (every run starts from the base), and twice the training time;
  * edits -> SFT (the edited text is the golden completion);
  * regenerate pairs -> DPO, or SimPO when the policy says memory is tight (no reference model);
  * thumbs only -> KTO.
A signal counts when it has at least min_new_examples usable examples new since the last cycle;
when none has (a schedule, decline or drift trigger with little new data), the same rule reads
the counts over the whole snapshot window; when even those are short, the largest signal wins.
A forget cycle retrains the tainted prod's method (like for like, without the forgotten rows).

Hyperparameters scale with the training split's size n from the runbook defaults
(app.training.methods.Hyperparameters):
  * epochs: 3 below 1,000 examples, 2 below 10,000, else 1;
  * effective batch: 16 (batch 1 x grad-accum 16; KTO 2 x 8), shrunk so an epoch has at least
    4 optimiser steps (grad_accum = n // 4, at least 1);
  * learning rate: the method's base (SFT 2e-4, ORPO 1e-4, DPO/SimPO/KTO 5e-5: preference losses
    take smaller steps) times sqrt(effective batch / 16), the square-root batch-size rule;
  * the policy's hyperparameters override any of these last.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from app.training.methods import Hyperparameters, Method

BASE_LEARNING_RATE: dict[str, float] = {
    "sft": 2e-4,
    "orpo": 1e-4,
    "dpo": 5e-5,
    "simpo": 5e-5,
    "kto": 5e-5,
}
FULL_BATCH = 16
MIN_STEPS_PER_EPOCH = 4


@dataclass(frozen=True)
class SignalCounts:
    """Usable examples per signal (exact-deduplicated by prompt)."""

    edits: int = 0
    regen_pairs: int = 0
    pairs: int = 0
    thumbs: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counts as a plain dict."""
        return asdict(self)


def _by_rule(c: SignalCounts, threshold: int, memory_tight: bool) -> tuple[Method, str] | None:
    edits, pairs, thumbs = c.edits >= threshold, c.regen_pairs >= threshold, c.thumbs >= threshold
    if edits and pairs:
        return "orpo", f"{c.edits} edits and {c.regen_pairs} regenerate pairs: ORPO on both"
    if edits:
        return "sft", f"{c.edits} edits: SFT on the edited answers"
    if pairs:
        if memory_tight:
            return "simpo", f"{c.regen_pairs} regenerate pairs, memory tight: SimPO"
        return "dpo", f"{c.regen_pairs} regenerate pairs: DPO"
    if thumbs:
        return "kto", f"{c.thumbs} thumbs, no edits or pairs: KTO"
    return None


def choose_method(
    new: SignalCounts,
    total: SignalCounts,
    *,
    min_examples: int,
    pinned: str | None = None,
    memory_tight: bool = False,
    trigger: str = "volume",
    prod_method: str | None = None,
) -> tuple[Method, str]:
    """The method a cycle trains with and why (see the module's docstring for the rule)."""
    if pinned:
        return pinned, f"pinned by the policy ({pinned})"  # type: ignore[return-value]
    if trigger == "forget" and prod_method:
        return (
            prod_method,  # type: ignore[return-value]
            f"forget: retrain the tainted prod's method ({prod_method}) without the forgotten rows",
        )
    for counts, scope in ((new, "new since the last cycle"), (total, "in the snapshot window")):
        found = _by_rule(counts, min_examples, memory_tight)
        if found:
            return found[0], f"{found[1]} ({scope}, threshold {min_examples})"
    largest = max(
        (total.edits, 3, "sft"),
        (total.regen_pairs, 2, "simpo" if memory_tight else "dpo"),
        (total.thumbs, 1, "kto"),
    )
    return (
        largest[2],  # type: ignore[return-value]
        f"no signal reaches {min_examples}: the largest ({largest[0]} examples) decides",
    )


def hyperparameters(
    method: str, n_train: int, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The settings a run of method on n_train examples gets (validated; only what is set)."""
    n = max(int(n_train), 1)
    epochs = 3 if n < 1000 else 2 if n < 10000 else 1
    batch = 2 if method == "kto" else 1
    full_accum = FULL_BATCH // batch
    grad_accum = max(1, min(full_accum, n // (batch * MIN_STEPS_PER_EPOCH)))
    effective = batch * grad_accum
    lr = BASE_LEARNING_RATE[method] * math.sqrt(effective / FULL_BATCH)
    hp: dict[str, Any] = {
        "epochs": epochs,
        "batch_size": batch,
        "grad_accum": grad_accum,
        "learning_rate": float(f"{lr:.3g}"),
    }
    hp |= dict(overrides or {})
    model = Hyperparameters(**hp)
    model.check_method(method)
    return model.model_dump(exclude_unset=True)
