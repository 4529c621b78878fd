"""The loop's method rule and settings (app/loop/method.py)."""

from __future__ import annotations

import pytest

from app.loop.method import (
    SETTINGS_LADDER,
    NothingToTeach,
    SignalCounts,
    choose_method,
    hyperparameters,
)


@pytest.mark.parametrize(
    ("counts", "memory_tight", "method"),
    [
        (SignalCounts(edits=40), False, "sft"),
        (SignalCounts(thumbs_up=12, thumbs_down=30), False, "sft"),  # what users liked
        (SignalCounts(edits=14, thumbs_down=30), False, "sft"),  # a third edit: the edits
        (SignalCounts(edits=10, thumbs_up=5, regen_pairs=9, pairs=19), False, "sft"),
        (SignalCounts(regen_pairs=40, pairs=40), False, "orpo"),
        (SignalCounts(regen_pairs=40, pairs=40), True, "simpo"),
        (SignalCounts(edits=5, regen_pairs=20, pairs=25, thumbs_down=50), False, "orpo"),
        (SignalCounts(edits=1, regen_pairs=7, pairs=8), False, "sft"),  # too few pairs
    ],
)
def test_the_whole_signal_picks_the_method(
    counts: SignalCounts, memory_tight: bool, method: str
) -> None:
    got, why = choose_method(counts, memory_tight=memory_tight)
    assert got == method
    assert f"{counts.edits} edits" in why


def test_thumbs_down_alone_never_trains() -> None:
    with pytest.raises(NothingToTeach, match="nothing to learn from"):
        choose_method(SignalCounts(thumbs_down=300))
    # Not even a pinned method trains on a set with no answer users wanted.
    with pytest.raises(NothingToTeach):
        choose_method(SignalCounts(thumbs_down=300), pinned="kto")


def test_desirable_counts_what_can_teach() -> None:
    c = SignalCounts(edits=3, thumbs_up=4, thumbs_down=100, regen_pairs=5, pairs=8)
    assert c.desirable == 12 and c.as_dict()["desirable"] == 12


def test_a_pinned_method_wins() -> None:
    got, why = choose_method(SignalCounts(edits=100), pinned="kto")
    assert (got, why) == ("kto", "pinned by the policy (kto)")


def test_forget_retrains_the_prods_method() -> None:
    got, _ = choose_method(SignalCounts(thumbs_up=9), trigger="forget", prod_method="dpo")
    assert got == "dpo"


def test_small_sets_get_short_lora_runs() -> None:
    hp = hyperparameters("sft", 24)
    assert hp == {
        "batch_size": 8,
        "grad_accum": 1,
        "max_steps": 9,  # three passes over 24 examples in batches of 8
        "learning_rate": 2e-3,
        "lr_scheduler": "constant",
        "warmup": 0.0,
    }
    assert hyperparameters("sft", 3)["max_steps"] == 8  # at least 8 steps
    assert hyperparameters("sft", 300)["max_steps"] == 60  # at most 60
    assert hyperparameters("kto", 1)["batch_size"] == 2  # KTO's KL term needs two
    assert (
        hyperparameters("orpo", 40)["learning_rate"] < hyperparameters("sft", 40)["learning_rate"]
    )


def test_large_sets_take_smaller_steps_with_decay() -> None:
    hp = hyperparameters("sft", 5000)
    assert hp["epochs"] == 2 and hp["lr_scheduler"] == "cosine"
    assert hp["learning_rate"] == pytest.approx(2e-4)
    assert hyperparameters("sft", 20000)["epochs"] == 1


def test_the_ladder_tries_a_stronger_setting_next() -> None:
    first, second = (hyperparameters("sft", 24, attempt=i) for i in range(2))
    lr_scale, steps_scale = SETTINGS_LADDER[1]
    assert second["learning_rate"] == pytest.approx(first["learning_rate"] * lr_scale)
    assert second["max_steps"] == round(first["max_steps"] * steps_scale)
    assert hyperparameters("sft", 24, attempt=99) == second  # past the end: the last one


def test_policy_overrides_win_and_are_validated() -> None:
    hp = hyperparameters("dpo", 100, {"learning_rate": 1e-3, "max_steps": 8})
    assert hp["learning_rate"] == 1e-3 and hp["max_steps"] == 8
    with pytest.raises(ValueError):
        hyperparameters("dpo", 100, {"no_such_key": 1})
    with pytest.raises(ValueError):
        hyperparameters("dpo", 100, {"packing": True})  # sft only
