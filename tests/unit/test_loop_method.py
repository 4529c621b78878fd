"""The loop's method rule and hyperparameter scaling (app/loop/method.py)."""

from __future__ import annotations

import pytest

from app.loop.method import SignalCounts, choose_method, hyperparameters

NONE = SignalCounts()


@pytest.mark.parametrize(
    ("new", "memory_tight", "method"),
    [
        (SignalCounts(edits=40), False, "sft"),
        (SignalCounts(regen_pairs=40, pairs=40), False, "dpo"),
        (SignalCounts(regen_pairs=40, pairs=40), True, "simpo"),
        (SignalCounts(thumbs=40), False, "kto"),
        (SignalCounts(edits=40, regen_pairs=40, pairs=80), False, "orpo"),
        (SignalCounts(edits=40, thumbs=400), False, "sft"),  # edits beat thumbs
        (SignalCounts(regen_pairs=40, thumbs=400), False, "dpo"),  # pairs beat thumbs
        (SignalCounts(edits=39, regen_pairs=40, pairs=79), False, "dpo"),  # edits below threshold
    ],
)
def test_each_signal_mix_picks_its_method(
    new: SignalCounts, memory_tight: bool, method: str
) -> None:
    got, why = choose_method(new, new, min_examples=40, memory_tight=memory_tight)
    assert got == method
    assert "new since the last cycle" in why


def test_a_pinned_method_wins() -> None:
    got, why = choose_method(SignalCounts(edits=100), NONE, min_examples=40, pinned="kto")
    assert (got, why) == ("kto", "pinned by the policy (kto)")


def test_forget_retrains_the_prods_method() -> None:
    got, _ = choose_method(SignalCounts(thumbs=99), NONE, min_examples=1, trigger="forget",
                           prod_method="dpo")  # fmt: skip
    assert got == "dpo"


def test_little_new_data_falls_back_to_the_window_then_the_largest() -> None:
    got, why = choose_method(
        SignalCounts(edits=3), SignalCounts(edits=3, thumbs=50), min_examples=40
    )
    assert got == "kto" and "snapshot window" in why
    got, why = choose_method(NONE, SignalCounts(edits=5, thumbs=2), min_examples=40)
    assert got == "sft" and "largest" in why


def test_hyperparameters_scale_with_the_dataset() -> None:
    small = hyperparameters("sft", 20)
    assert small == {
        "epochs": 3,
        "batch_size": 1,
        "grad_accum": 5,
        "learning_rate": pytest.approx(2e-4 * (5 / 16) ** 0.5, rel=1e-2),
    }
    big = hyperparameters("sft", 20000)
    assert big["epochs"] == 1 and big["grad_accum"] == 16 and big["learning_rate"] == 2e-4
    assert hyperparameters("sft", 5000)["epochs"] == 2
    kto = hyperparameters("kto", 1000)
    assert kto["batch_size"] == 2 and kto["grad_accum"] == 8 and kto["learning_rate"] == 5e-5


def test_policy_overrides_win_and_are_validated() -> None:
    hp = hyperparameters("dpo", 100, {"learning_rate": 1e-3, "max_steps": 8})
    assert hp["learning_rate"] == 1e-3 and hp["max_steps"] == 8
    with pytest.raises(ValueError):
        hyperparameters("dpo", 100, {"no_such_key": 1})
    with pytest.raises(ValueError):
        hyperparameters("dpo", 100, {"packing": True})  # sft only
