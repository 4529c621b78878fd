"""OpenAI fine-tuning lines to cft examples, and "auto" hyperparameters to the loop's rule."""

from __future__ import annotations

import json

import pytest

from app.finetuning import jsonl
from app.finetuning.hyperparameters import resolve
from app.finetuning.schemas import DpoHyperparameters, SupervisedHyperparameters
from app.loop.method import hyperparameters as loop_settings


def _line(row: object) -> bytes:
    return json.dumps(row).encode() + b"\n"


def test_each_trained_assistant_message_is_one_example_with_its_context() -> None:
    row = {
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}],
            },
            {"role": "assistant", "content": "Hello.", "weight": 0},
            {"role": "user", "content": "Sum 1 and 1?", "name": "ann"},
            {"role": "assistant", "content": "2."},
        ]
    }
    parsed = jsonl.parse(_line(row) + b"\n")
    assert (parsed.format, parsed.lines) == ("chat", 1)
    assert parsed.examples == [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Sum 1 and 1?"},
                {"role": "assistant", "content": "2."},
            ]
        }
    ]
    row["messages"][2]["weight"] = 1
    assert len(jsonl.parse(_line(row)).examples) == 2


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"messages": [{"role": "assistant", "content": "x"}]}, "needs a message before it"),
        ({"messages": [{"role": "user", "content": "x", "weight": 0}]}, "assistant messages only"),
        ({"messages": [{"role": "user", "content": "a\u0000b"}]}, "NUL"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "only text parts",
        ),
        ({"messages": [{"role": "assistant", "content": "x", "tool_calls": []}]}, "tool calls"),
        (
            {
                "input": {"messages": [{"role": "user", "content": "q"}]},
                "preferred_output": [{"role": "assistant", "content": "a"}] * 2,
                "non_preferred_output": [{"role": "assistant", "content": "b"}],
            },
            "exactly one assistant message",
        ),
    ],
)
def test_a_bad_line_says_what_to_fix(row: dict[str, object], needle: str) -> None:
    with pytest.raises(jsonl.FileFormatError) as exc:
        jsonl.parse(_line(row), name="f.jsonl")
    assert exc.value.message.startswith("f.jsonl, line 1: ") and needle in exc.value.message


def test_auto_is_the_loops_rule_and_given_values_replace_it() -> None:
    for n in (3, 50, 1000):
        hp, shown = resolve("sft", n, SupervisedHyperparameters(), seed=5, where="h")
        assert hp == loop_settings("sft", n) | {"seed": 5}
        assert shown["batch_size"] == hp["batch_size"] * hp["grad_accum"]
        assert shown["learning_rate_multiplier"] == 1.0 and shown["n_epochs"] >= 1
    given = DpoHyperparameters(batch_size=4, n_epochs=2, learning_rate_multiplier=2, beta=0.3)
    hp, shown = resolve("dpo", 20, given, seed=1, where="h")
    rule = loop_settings("dpo", 20)
    assert hp["learning_rate"] == pytest.approx(rule["learning_rate"] * 2)
    assert (hp["batch_size"], hp["grad_accum"], hp["epochs"], hp["max_steps"]) == (4, 1, 2, -1)
    assert shown == {"batch_size": 4, "learning_rate_multiplier": 2, "n_epochs": 2, "beta": 0.3}
