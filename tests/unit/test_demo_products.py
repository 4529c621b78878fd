"""The demo's users drive any simulated product: the support product as before, and the
benchmark products of bench/products.py with their own rules and feedback mixes."""

from __future__ import annotations

import random
from typing import Any

from app.demo.loop import DemoConfig, Traffic
from app.demo.product import Question, SupportProduct, questions
from bench.products import PRODUCTS


class Scripted(Traffic):
    """Traffic whose model answers from a script and whose feedback is recorded, not sent."""

    def __init__(self, product: Any, answers: list[str]):
        super().__init__(None, DemoConfig(), print, product)  # type: ignore[arg-type]
        self.answers = answers
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def _chat(self, user: str, q: Any, kind: str = "") -> tuple[str, str]:
        text = self.answers.pop(0)
        if kind:
            tally = self.accepted.setdefault(kind, {}).setdefault("base", [0, 0])
            tally[0] += self.product.follows(text)
            tally[1] += 1
        return f"r{len(self.answers)}", text

    def _feedback(self, rid: str, body: dict[str, Any]) -> None:
        self.sent.append((rid, body))


def test_support_product_is_the_demo_product() -> None:
    p = SupportProduct()
    assert p.split() == questions()
    q = Question("router", "won't turn on")
    assert p.messages(q) == q.messages and p.wanted(q) == q.wanted_answer()
    assert p.follows("Dear customer, hello") and not p.follows("Hello")
    assert p.mix.p_up == 1.0


def test_a_liked_answer_draws_no_random_number_when_every_like_is_rated() -> None:
    # The support demo's users draw exactly as before: a liked answer is rated up, no draw.
    t = Scripted(SupportProduct(), ["Dear customer, restart it."])
    rng = random.Random(5)
    assert t.one_user("u", Question("router", "won't turn on"), rng, "observe")
    assert t.sent == [("r0", {"thumbs": 1})]
    assert rng.random() == random.Random(5).random()
    assert t.accepted == {"observe": {"base": [1, 1]}}


def test_bench_products_use_their_rule_and_mix() -> None:
    bank = PRODUCTS["bank"]
    train, _ = bank.split()
    t = Scripted(bank, ["Sure, open the app."] * 40)
    for i in range(20):
        assert not t.one_user(f"u{i}", train[i], random.Random(i), "observe")
    edits = [b for _, b in t.sent if "edited_completion" in b]
    assert len(edits) >= 10  # edit-heavy
    assert all(bank.follows(b["edited_completion"]) for b in edits)
    assert t.accepted == {"observe": {"base": [0, 20]}}

    quiz = PRODUCTS["quiz"]  # thumbs only: some liked answers stay unrated (p_up 0.8)
    qs, _ = quiz.split()
    t = Scripted(quiz, ["Paris."] * 40)
    assert all(t.one_user(f"u{i}", qs[i], random.Random(i)) for i in range(40))
    assert 0 < len(t.sent) < 40 and all(b == {"thumbs": 1} for _, b in t.sent)

    triage = PRODUCTS["triage"]  # a system prompt: the chat carries it
    q = triage.split()[0][0]
    assert triage.messages(q)[0]["role"] == "system"
