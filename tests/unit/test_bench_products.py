"""The simulated products of bench/products.py: rules, wanted answers, pools and users."""

from __future__ import annotations

import pytest

from bench.products import PRODUCTS, Product, simulate_users

# A typical answer of the bare base model (it follows no product's rule but the length limit's
# when short, so it is long here).
BASE_LIKE = (
    "To solve this problem, you can open the settings of your device and look for the option"
    " that matches what you need, then follow the steps shown on the screen."
)


@pytest.mark.parametrize("name", list(PRODUCTS))
def test_wanted_answers_follow_the_rule_and_the_base_like_answer_does_not(name: str):
    p = PRODUCTS[name]
    train, held = p.split()
    for q in train + held:
        assert p.follows(p.wanted(q)), (q, p.wanted(q))
    assert not p.follows(BASE_LIKE)
    assert not p.follows("")


@pytest.mark.parametrize("name", list(PRODUCTS))
def test_pools_are_deterministic_disjoint_and_large_enough(name: str):
    p = PRODUCTS[name]
    train, held = p.split()
    assert (train, held) == p.split()
    assert p.split(seed=8) != (train, held)
    assert not set(train) & set(held)
    assert len(held) == p.held_out and len(train) >= 50
    chat = p.messages(train[0])
    assert chat[-1] == {"role": "user", "content": train[0].text}
    assert (chat[0]["role"] == "system") == bool(p.system)


def test_products_differ_in_rule_and_feedback_mix():
    assert len(PRODUCTS) >= 6
    assert len({p.rule for p in PRODUCTS.values()}) == len(PRODUCTS)
    assert len({p.mix for p in PRODUCTS.values()}) == len(PRODUCTS)
    assert any(p.history for p in PRODUCTS.values())
    # The demo's greeting is nobody's rule here.
    assert not any(p.follows("Dear customer, " + BASE_LIKE) for p in PRODUCTS.values())


def test_rules_on_edge_cases():
    triage, quiz, policy, hotel, acme = (PRODUCTS[n] for n in
                                         ("triage", "quiz", "policy", "hotel", "acme"))  # fmt: skip
    assert triage.follows(' {"category": "billing", "priority": "low"}\n')
    assert not triage.follows('{"category": "billing"}')
    assert not triage.follows('{"category": "billing", "priority": "urgent"}')
    assert not triage.follows('```json\n{"category": "billing", "priority": "low"}\n```')
    assert quiz.follows("Paris.") and not quiz.follows(" ".join(["word"] * 13))
    assert policy.follows("Yes, you can.") and policy.follows("No.")
    assert not policy.follows("Yesterday we changed it.")
    assert hotel.follows("Por supuesto, usted puede.") and hotel.follows("Estimado señor: ...")
    assert not hotel.follows("Claro, tú puedes ir.")
    assert acme.follows("It ships today.\n— Team Acme  ") and not acme.follows("— Team Acme, hi")


def _fixed_model(p: Product, first: str, second: str):
    def answer(qs: list, round_: int) -> list[str]:
        return [first if round_ == 0 else second for _ in qs]

    return answer


@pytest.mark.parametrize("name", list(PRODUCTS))
def test_users_react_by_their_feedback_mix(name: str):
    p = PRODUCTS[name]
    train, _ = p.split()
    qs = train[:50]
    # The model never follows the rule, then follows it when asked again.
    s = simulate_users(p, qs, _fixed_model(p, BASE_LIKE, p.wanted(qs[0])), seed=3)
    c = s.counts()
    assert c["users"] == 50 and c["up"] + c["down"] + c["edits"] <= c["answers"]
    assert c["edits"] == sum(x.edited == p.wanted(x.question) for x in s.interactions)
    if p.mix.p_edit == 0:
        assert c["edits"] == 0
    if p.mix.p_regenerate == 0:
        assert c["regenerated"] == 0
    for x in s.interactions:
        if x.regenerated_by is not None:
            assert x.thumbs == -1 and x.regenerated_by.thumbs == 1
    # A model that always follows the rule only gets thumbs-up (or nothing).
    liked = simulate_users(p, qs, _fixed_model(p, p.wanted(qs[0]), ""), seed=3).counts()
    assert liked["down"] == liked["edits"] == liked["regenerated"] == 0
    assert liked["up"] > 0


def test_with_content_refuses_the_bare_marker():
    acme, bank, quiz = PRODUCTS["acme"], PRODUCTS["bank"], PRODUCTS["quiz"]
    assert acme.follows("— Team Acme") and not acme.with_content("— Team Acme")
    assert acme.with_content("It ships today.\n— Team Acme")
    assert not bank.with_content("Hi, Nordbank support here.")
    assert quiz.with_content("Paris.") and not quiz.with_content(BASE_LIKE)
    for p in PRODUCTS.values():
        train, _ = p.split()
        assert all(p.with_content(p.wanted(q)) for q in train)
