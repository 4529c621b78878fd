"""Scoring, standalone: held-out likelihood metrics with PEFT, task-suite checks, generation.

No database or queue imports: functions from a model and examples to numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from app.evals import checks

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


def accepted_answer(
    method: str, example: dict[str, Any]
) -> tuple[list[dict[str, Any]], str] | None:
    """An example's prompt and the answer users accepted or wrote (None: it holds none)."""
    if method in PREFERENCE:
        return list(example["prompt"]), str(example["chosen"][0]["content"])
    if method == "kto":
        if not example.get("label"):
            return None
        return list(example["prompt"]), str(example["completion"][0]["content"])
    prompt, completion = split_prompt(example)
    return prompt, str(completion[0]["content"])


def _words(text: str) -> list[str]:
    return text.lower().split()


def answer_similarity(answer: str, reference: str) -> float:
    """ROUGE-L F1 of two texts' words: 1 for the same words in order, 0 for none in common."""
    a, b = _words(answer)[:256], _words(reference)[:256]
    if not a or not b:
        return float(a == b)
    prev = [0] * (len(b) + 1)
    for x in a:  # longest common subsequence, one row at a time
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    lcs = prev[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(a), lcs / len(b)
    return 2 * precision * recall / (precision + recall)


def heldout_generation(
    model: Any, tok: Any, method: str, examples: list[dict[str, Any]], max_examples: int = 16
) -> dict[str, float]:
    """The model's greedy answers to held-out prompts against the answers users accepted or
    wrote: mean answer_similarity (NaN when no example holds an accepted answer)."""
    pairs = [p for p in (accepted_answer(method, ex) for ex in examples) if p is not None]
    pairs = pairs[:max_examples]
    if not pairs:
        return {"answer_similarity": math.nan, "n": 0}
    longest = max(len(tok(ref, add_special_tokens=False)["input_ids"]) for _, ref in pairs)
    answers = generate_batch(model, tok, [prompt for prompt, _ in pairs], min(longest + 8, 96))
    scores = [answer_similarity(a, ref) for a, (_, ref) in zip(answers, pairs, strict=True)]
    return {"answer_similarity": sum(scores) / len(scores), "n": len(scores)}


def generate_batch(
    model: Any, tok: Any, prompts: list[list[dict[str, Any]]], max_tokens: int
) -> list[str]:
    """Greedy answers to several chats in one batch (left-padded), adapter state as set."""
    import torch

    rows = []
    for messages in prompts:
        ids = tok.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        rows.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
    width = max(len(r) for r in rows)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    device = next(model.parameters()).device
    x = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    with torch.no_grad():
        out = model.generate(
            input_ids=x,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
    return [str(tok.decode(o[width:], skip_special_tokens=True)) for o in out]


# Answers to many chats at once: [(messages, max_tokens), ...] -> the answers, in order. The
# in-process path batches them; the engine path keeps several in flight (the engine batches).
Answer = Callable[[list[tuple[list[dict[str, Any]], int]]], list[str]]

# Chats generated in one batch in process (left-padded: padding costs compute on the CPU).
LOCAL_BATCH = 16


def answer_cases(cases: list[dict[str, Any]], answer: Answer) -> list[str]:
    """Each case's answer (its messages, up to its max_tokens), in order."""
    return answer([(case["messages"], int(case["max_tokens"])) for case in cases])


def pass_rate(cases: list[dict[str, Any]], answer: Answer) -> tuple[float, list[dict[str, Any]]]:
    """Pass rate of cases answered by `answer`, and each case's outcome."""
    outcomes = [
        {
            "case_id": case["id"],
            "passed": checks.check(case["check_kind"], case["expected"], text),
            "answer": text,
        }
        for case, text in zip(cases, answer_cases(cases, answer), strict=True)
    ]
    if not outcomes:
        return math.nan, outcomes
    return sum(o["passed"] for o in outcomes) / len(outcomes), outcomes


def local_answers(model: Any, tok: Any) -> Answer:
    """Greedy answers by the in-process model (adapter state as set by the caller), in batches
    of up to LOCAL_BATCH chats that share a max_tokens."""

    def answer(chats: list[tuple[list[dict[str, Any]], int]]) -> list[str]:
        out: list[str | None] = [None] * len(chats)
        by_length: dict[int, list[int]] = {}
        for i, (_, max_tokens) in enumerate(chats):
            by_length.setdefault(max_tokens, []).append(i)
        for max_tokens, indexes in by_length.items():
            for at in range(0, len(indexes), LOCAL_BATCH):
                chunk = indexes[at : at + LOCAL_BATCH]
                texts = generate_batch(model, tok, [chats[i][0] for i in chunk], max_tokens)
                for i, text in zip(chunk, texts, strict=True):
                    out[i] = text
        return [text or "" for text in out]

    return answer
