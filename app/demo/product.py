"""A support product whose users have a hidden, checkable house style.

Users ask a support route about a device problem. They want every answer to open with the
house greeting "Dear customer," — the bare base model never does that. A user rates an answer
up when it follows the style. An unhappy user either fixes the answer (edits it into what they
wanted, without also rating it: the edit is the SFT signal, and the original and its edit also
form a preference pair), or rates it down and sometimes presses "regenerate" (then rates the new
answer too).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

GREETING = "Dear customer,"
STYLE_REGEX = r"^\s*Dear customer,"

PRODUCTS = [
    "router", "printer", "laptop", "phone", "tablet", "smart TV", "modem", "headset",
    "camera", "smartwatch", "speaker", "monitor", "keyboard", "game console", "e-reader",
]  # fmt: skip
PROBLEMS = [
    "won't turn on", "keeps restarting", "has no sound", "is very slow",
    "won't connect to wifi", "shows an error code", "gets too hot", "won't charge",
]  # fmt: skip


@dataclass(frozen=True)
class Question:
    """One support question."""

    product: str
    problem: str

    @property
    def messages(self) -> list[dict[str, str]]:
        """The chat messages the product sends."""
        return [{"role": "user", "content": f"My {self.product} {self.problem}. What should I do?"}]

    def wanted_answer(self) -> str:
        """What a user writes when they edit the answer into the house style."""
        return (
            f"{GREETING} we are sorry that your {self.product} {self.problem}. Please restart it,"
            " and if the problem persists, contact us with its serial number."
        )


def follows_style(answer: str | None) -> bool:
    """The hidden preference: the answer opens with the house greeting."""
    return bool(answer) and answer.lstrip().startswith(GREETING)  # type: ignore[union-attr]


def questions(seed: int = 7) -> tuple[list[Question], list[Question]]:
    """All questions, split deterministically into (training traffic, held out)."""
    rng = random.Random(seed)
    qs = [Question(p, q) for p in PRODUCTS for q in PROBLEMS]
    rng.shuffle(qs)
    cut = int(len(qs) * 0.75)
    return qs[:cut], qs[cut:]


@dataclass(frozen=True)
class UserBehaviour:
    """How simulated users react to an answer they dislike."""

    p_edit: float = 0.6  # edit the answer (and do not rate it)
    p_regenerate: float = 0.5  # of those who rate it down: press regenerate
    p_up: float = 1.0  # a liked answer is rated up (else left unrated)


@dataclass(frozen=True)
class SupportProduct:
    """The support product with the interface the demo drives any simulated product through
    (app/demo/loop.py `SimProduct`; bench/products.py's products have it too)."""

    name: str = "support"
    rule: str = f"opens with {GREETING!r}"
    max_tokens: int = 12
    mix: UserBehaviour = UserBehaviour()

    def split(self, seed: int = 7) -> tuple[list[Question], list[Question]]:
        """The questions, split into (training traffic, held out)."""
        return questions(seed)

    def messages(self, q: Question) -> list[dict[str, str]]:
        """The chat a user sends."""
        return q.messages

    def follows(self, answer: str) -> bool:
        """The hidden preference (the house greeting)."""
        return follows_style(answer)

    def wanted(self, q: Question) -> str:
        """What a user writes when they edit an answer."""
        return q.wanted_answer()
