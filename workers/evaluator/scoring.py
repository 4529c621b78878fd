"""Scoring, standalone: held-out likelihood metrics with PEFT, task-suite checks, generation.

No database or queue imports: functions from a model and examples to numbers.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

PREFERENCE = ("dpo", "orpo", "simpo")


def _completion_ids(
    tok: Any, prompt: list[dict[str, Any]], completion: list[dict[str, Any]]
) -> tuple[list[int], int]:
    """Token ids of prompt + completion, and where the completion starts."""
    full = tok.apply_chat_template(prompt + completion, tokenize=True, return_dict=False)
    head = tok.apply_chat_template(
        prompt, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    ids = list(full if isinstance(full, list) else full["input_ids"])
    start = len(head if isinstance(head, list) else head["input_ids"])
    return ids, start


def completion_logp(
    model: Any,
    tok: Any,
    prompt: list[dict[str, Any]],
    completion: list[dict[str, Any]],
    max_length: int = 512,
) -> tuple[float, int]:
    """Sum of log-probabilities of the completion's tokens given the prompt, and their count."""
    import torch

    ids, start = _completion_ids(tok, prompt, completion)
    cut = max(0, len(ids) - max_length)
    ids, start = ids[cut:], max(1, start - cut)
    if start >= len(ids):
        return 0.0, 0
    device = next(model.parameters()).device
    x = torch.tensor([ids], device=device)
    with torch.no_grad():
        logits = model(input_ids=x).logits[0, :-1].float()
    logp = torch.log_softmax(logits, dim=-1)
    target = x[0, 1:]
    picked = logp.gather(1, target.unsqueeze(1)).squeeze(1)[start - 1 :]
    return float(picked.sum()), int(picked.numel())


def split_prompt(example: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """An SFT example's prompt (everything before the last assistant turn) and that turn."""
    messages = list(example["messages"])
    last = max(i for i, m in enumerate(messages) if m.get("role") == "assistant")
    return messages[:last], messages[last : last + 1]


def heldout_metrics(
    model: Any, tok: Any, method: str, examples: list[dict[str, Any]]
) -> dict[str, float]:
    """Held-out metrics of model (as it is now: adapter on or off) on one split.

    sft/kto: token-weighted mean loss and perplexity of the assistant tokens (kto: desirable
    completions only). dpo/orpo/simpo: preference accuracy (chosen logp > rejected logp) and the
    mean log-likelihood margin chosen - rejected. No usable example gives NaN (fails closed).
    """
    if method in PREFERENCE:
        wins, margins = 0, []
        for ex in examples:
            c, _ = completion_logp(model, tok, ex["prompt"], ex["chosen"])
            r, _ = completion_logp(model, tok, ex["prompt"], ex["rejected"])
            margins.append(c - r)
            wins += c > r
        if not margins:
            return {"preference_accuracy": math.nan, "reward_margin": math.nan, "n": 0}
        return {
            "preference_accuracy": wins / len(margins),
            "reward_margin": sum(margins) / len(margins),
            "n": len(margins),
        }
    total, count, n = 0.0, 0, 0
    for ex in examples:
        if method == "kto":
            if not ex.get("label"):
                continue
            prompt, completion = ex["prompt"], ex["completion"]
        else:
            prompt, completion = split_prompt(ex)
        s, k = completion_logp(model, tok, prompt, completion)
        total, count, n = total + s, count + k, n + 1
    if count == 0:
        return {"loss": math.nan, "perplexity": math.nan, "n": 0}
    loss = -total / count
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "n": n}


def check(kind: str, expected: Any, text: str) -> bool:
    """Whether one answer passes one case's check."""
    if kind == "exact":
        return text.strip() == str(expected).strip()
    if kind == "contains":
        needles = expected if isinstance(expected, list) else [expected]
        return all(str(n).lower() in text.lower() for n in needles)
    if kind == "regex":
        return re.search(str(expected), text) is not None
    if kind == "max_length":
        return len(text) <= int(expected)
    if kind == "json_schema":
        import jsonschema

        try:
            jsonschema.validate(json.loads(text), expected)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    raise ValueError(f"unknown check kind {kind!r}")


Generate = Callable[[list[dict[str, Any]], int], str]


def pass_rate(
    cases: list[dict[str, Any]], generate: Generate
) -> tuple[float, list[dict[str, Any]]]:
    """Pass rate of cases answered by generate(messages, max_tokens), and each case's outcome."""
    outcomes = []
    for case in cases:
        text = generate(case["messages"], int(case["max_tokens"]))
        outcomes.append(
            {
                "case_id": case["id"],
                "passed": check(case["check_kind"], case["expected"], text),
                "answer": text,
            }
        )
    if not outcomes:
        return math.nan, outcomes
    return sum(o["passed"] for o in outcomes) / len(outcomes), outcomes


def local_generate(model: Any, tok: Any) -> Generate:
    """Greedy generation with the in-process model (adapter state as set by the caller)."""

    def generate(messages: list[dict[str, Any]], max_tokens: int) -> str:
        import torch

        ids = tok.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        ids = list(ids if isinstance(ids, list) else ids["input_ids"])
        device = next(model.parameters()).device
        x = torch.tensor([ids], device=device)
        with torch.no_grad():
            out = model.generate(
                input_ids=x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
        return str(tok.decode(out[0, len(ids) :], skip_special_tokens=True))

    return generate
