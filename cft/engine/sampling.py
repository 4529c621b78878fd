"""A request's next token from its logits, with its own sampling parameters and generator."""

from __future__ import annotations

import random
from typing import Any

from cft.engine.request import GenRequest


def seed(req: GenRequest) -> None:
    """Give the request its own generator: its seed, or a random one."""
    import torch

    value = req.sampling.seed if req.sampling.seed is not None else random.getrandbits(63)
    req.generator = torch.Generator().manual_seed(value)


def sample(logits: Any, req: GenRequest) -> int:
    """The request's next token from its logits (greedy at temperature 0, else top-p)."""
    import torch

    s = req.sampling
    if s.temperature <= 0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits / s.temperature, dim=-1)
    if s.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_p, dim=-1)
        drop = cumulative - sorted_p > s.top_p
        sorted_p[drop] = 0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
        probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=req.generator).item())
