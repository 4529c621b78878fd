"""Simulated products for loop benchmarks: domains, hidden rules users reward, and their users.

Each product differs from the demo (app/demo/product.py: "Dear customer,") and from the others
in its domain, the rule its users reward, and how its unhappy users give feedback:

    name     domain                       rule users reward                     feedback mix
    bank     banking support              opens with "Hi, Nordbank support here."  edit-heavy
    triage   ticket triage (system prompt) a JSON object {"category", "priority"}  mixed
    quiz     trivia app (system prompt)   at most 12 words                        thumbs only
    policy   store policy yes/no FAQ      first word is "Yes" or "No"             regenerate-heavy
    hotel    hotel desk, asked in Spanish formal Spanish: starts "Estimado" or     a third edit,
                                          uses "usted"                            the rest thumbs
    acme     order help, multi-turn chat  ends with the line "— Team Acme"        edits + regenerates

A product gives deterministic question pools (`product.split(seed)`: train traffic, held out),
the chat a user sends (`product.messages(q)`: optional system prompt and previous exchange),
`product.follows(answer)` (plain string operations or json.loads, no regex), and
`product.wanted(q)`, what a user writes when they edit an answer (it follows the rule).
`simulate_users` plays a product's users (`react`, `regenerated`); `base_rates` measures how often the
bare base follows each rule (greedy and sampled). The rules the base sometimes follows at
temperature 0.7 (quiz, policy) carry the thumbs-only and regenerate-heavy products: a thumbs-up
or a regenerate pair needs an answer the user likes.

    PYTHONPATH=. .venv/bin/python bench/products.py [--held-out 40] [--products quiz,policy]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Chat = list[dict[str, str]]


@dataclass(frozen=True)
class Question:
    """One question: its text and the facts the product's wanted answer is written from."""

    text: str
    facts: tuple[str, ...] = ()


@dataclass(frozen=True)
class FeedbackMix:
    """How a product's users react. A liked answer gets a thumbs-up with p_up (else nothing);
    an unhappy user edits it with p_edit, else rates it down and, with p_regenerate, presses
    regenerate and rates the new answer (up if it follows the rule, else down)."""

    p_edit: float
    p_regenerate: float
    p_up: float = 1.0
    label: str = ""


@dataclass(frozen=True)
class Product:
    """A simulated product (see the module's docstring)."""

    name: str
    domain: str
    rule: str
    follows: Callable[[str], bool]
    pool: Callable[[], list[Question]]
    wanted: Callable[[Question], str]
    mix: FeedbackMix
    max_tokens: int  # generation budget of an answer that follows the rule
    system: str | None = None
    history: Callable[[Question], Chat] | None = None
    held_out: int = 40
    marker: str | None = None  # the fixed text the rule asks for (a prefix or a closing line)

    def with_content(self, answer: str) -> bool:
        """The answer follows the rule and says something: with the marker taken out, at least
        two words are left (an adapter can learn to answer with the bare marker)."""
        if not self.follows(answer):
            return False
        return not self.marker or len(answer.replace(self.marker, " ").split()) >= 2

    def messages(self, q: Question) -> Chat:
        """The chat a user sends: system prompt, previous exchange, then the question."""
        chat: Chat = [{"role": "system", "content": self.system}] if self.system else []
        if self.history:
            chat += self.history(q)
        return [*chat, {"role": "user", "content": q.text}]

    def split(self, seed: int = 7) -> tuple[list[Question], list[Question]]:
        """All questions shuffled by seed, split into (train traffic, held out)."""
        qs = sorted(set(self.pool()), key=lambda q: (q.text, q.facts))
        random.Random(f"{self.name}:{seed}").shuffle(qs)
        return qs[: -self.held_out], qs[-self.held_out :]


# -- rules (plain string operations) -----------------------------------------------------------
def _words(text: str) -> list[str]:
    return text.split()


def _first_word(text: str) -> str:
    words = _words(text)
    return words[0].strip(".,;:!?\"'*") if words else ""


def starts_with(prefix: str) -> Callable[[str], bool]:
    """The answer opens with prefix (leading whitespace ignored)."""
    return lambda answer: answer.lstrip().startswith(prefix)


def ends_with(suffix: str) -> Callable[[str], bool]:
    """The answer's last line is suffix (trailing whitespace ignored)."""
    return lambda answer: answer.rstrip().endswith(suffix)


def json_with_keys(
    keys: tuple[str, ...], allowed: dict[str, tuple[str, ...]]
) -> Callable[[str], bool]:
    """The whole answer is one JSON object with these keys, values among the allowed ones."""

    def check(answer: str) -> bool:
        try:
            obj = json.loads(answer.strip())
        except ValueError:
            return False
        if not isinstance(obj, dict) or set(obj) != set(keys):
            return False
        return all(obj[k] in vs for k, vs in allowed.items())

    return check


def at_most_words(n: int) -> Callable[[str], bool]:
    """A non-empty answer of at most n whitespace-separated words."""
    return lambda answer: 0 < len(_words(answer)) <= n


def yes_or_no_first(answer: str) -> bool:
    """The answer's first word is Yes or No."""
    return _first_word(answer) in ("Yes", "No")


def formal_spanish(answer: str) -> bool:
    """Formal Spanish (proxy): opens with "Estimado" or uses the word "usted"."""
    if answer.lstrip().startswith("Estimado"):
        return True
    return any(w.strip(".,;:!?¡¿\"'()") == "usted" for w in answer.lower().split())


# -- bank: edit-heavy, a fixed greeting ---------------------------------------------------------
BANK_PREFIX = "Hi, Nordbank support here."
BANK_TASKS = {
    "block my debit card": "tap Cards, choose the card and press Block",
    "change my PIN": "tap Cards, then Change PIN, and confirm with your passcode",
    "raise my transfer limit": "tap Settings, then Limits, and set the new daily limit",
    "order a new credit card": "tap Cards, then Order card, and pick the credit card",
    "set up a standing order": "tap Payments, then Standing orders, and add the payee",
    "dispute a card payment": "open the payment and press Dispute",
    "update my address": "tap Profile, then Address, and save the new one",
    "download a statement": "tap Accounts, then Statements, and pick the month",
    "open a savings account": "tap Accounts, then Open account, and choose Savings",
    "add a new payee": "tap Payments, then Payees, and press Add",
    "turn on travel mode": "tap Cards, then Travel, and pick the countries",
    "reset my online banking password": "press Forgot password on the login screen",
}
BANK_ASKS = [
    "How do I {t}?", "How can I {t} in the app?", "What's the quickest way to {t}?",
    "I need to {t}. How?", "Can you tell me how to {t}?", "Where do I go to {t}?",
    "Please explain how to {t}.", "I want to {t} today. What are the steps?",
    "Is there a way to {t} from my phone?", "Help me {t}, please.",
]  # fmt: skip


def _bank_pool() -> list[Question]:
    return [Question(a.format(t=t), (t,)) for t in BANK_TASKS for a in BANK_ASKS]


def _bank_wanted(q: Question) -> str:
    task = q.facts[0]
    return f"{BANK_PREFIX} To {task}, open the Nordbank app, {BANK_TASKS[task]}."


# -- triage: mixed feedback, JSON -------------------------------------------------------------
TRIAGE_ITEMS = ["blender", "jacket", "laptop", "sofa", "phone case", "lamp", "kettle", "backpack"]
TRIAGE_ISSUES = {
    "arrived broken": ("damage", "high"),
    "never arrived": ("delivery", "high"),
    "arrived two days late": ("delivery", "low"),
    "was charged twice": ("billing", "high"),
    "has the wrong colour": ("wrong_item", "medium"),
    "is missing a part": ("wrong_item", "medium"),
    "shows a wrong price on the invoice": ("billing", "medium"),
    "came without a receipt": ("billing", "low"),
    "has a small scratch": ("damage", "low"),
    "is a different model than I ordered": ("wrong_item", "medium"),
}
TRIAGE_FORMS = ["My {i} {p}.", "Order 1{n:03d}: the {i} {p}.", "Hello, the {i} I bought {p}."]
TRIAGE_KEYS = ("category", "priority")
TRIAGE_ALLOWED = {
    "category": ("damage", "delivery", "billing", "wrong_item"),
    "priority": ("low", "medium", "high"),
}


def _triage_pool() -> list[Question]:
    return [
        Question(form.format(i=item, p=issue, n=7 * i + j), (issue,))
        for i, item in enumerate(TRIAGE_ITEMS)
        for j, issue in enumerate(TRIAGE_ISSUES)
        for form in TRIAGE_FORMS
    ]


def _triage_wanted(q: Question) -> str:
    category, priority = TRIAGE_ISSUES[q.facts[0]]
    return json.dumps({"category": category, "priority": priority})


# -- quiz: thumbs only, at most 12 words --------------------------------------------------------
CAPITALS = {
    "France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo", "Egypt": "Cairo",
    "Canada": "Ottawa", "Kenya": "Nairobi", "Peru": "Lima", "Norway": "Oslo", "Greece": "Athens",
    "Portugal": "Lisbon", "Ireland": "Dublin", "Austria": "Vienna", "Poland": "Warsaw",
    "Chile": "Santiago", "Cuba": "Havana", "Thailand": "Bangkok", "Germany": "Berlin",
}  # fmt: skip
LEGS = {"spider": 8, "dog": 4, "chicken": 2, "ant": 6, "horse": 4, "duck": 2, "beetle": 6,
        "octopus": 8, "cat": 4, "bee": 6}  # fmt: skip
AUTHORS = {"Hamlet": "William Shakespeare", "Don Quixote": "Miguel de Cervantes",
           "War and Peace": "Leo Tolstoy", "Pride and Prejudice": "Jane Austen",
           "The Odyssey": "Homer", "Oliver Twist": "Charles Dickens",
           "Moby-Dick": "Herman Melville", "Frankenstein": "Mary Shelley"}  # fmt: skip


def _quiz_pool() -> list[Question]:
    out = [Question(f"What is the capital of {c}?", (f"The capital of {c} is {v}.",))
           for c, v in CAPITALS.items()]  # fmt: skip
    out += [Question(f"Which city is the capital of {c}?", (f"{v} is the capital of {c}.",))
            for c, v in CAPITALS.items()]  # fmt: skip
    out += [Question(f"How many legs does a {a} have?", (f"A {a} has {n} legs.",))
            for a, n in LEGS.items()]  # fmt: skip
    out += [Question(f"Who wrote {b}?", (f"{v} wrote {b}.",)) for b, v in AUTHORS.items()]
    rng = random.Random(3)
    for _ in range(40):
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        out.append(Question(f"What is {a} plus {b}?", (f"{a} plus {b} is {a + b}.",)))
    return out


# -- policy: regenerate-heavy, Yes/No first -----------------------------------------------------
POLICY = {
    "return an item after 30 days": ("No", "Returns are accepted within 30 days of delivery."),
    "return an opened item": ("Yes", "Opened items can be returned within 30 days."),
    "pay with PayPal": ("Yes", "PayPal is accepted at checkout."),
    "pay in cash on delivery": ("No", "We only accept card and PayPal payments."),
    "change my order after it has shipped": ("No", "Shipped orders cannot be changed."),
    "cancel an order before it ships": ("Yes", "Cancel it from your account page."),
    "get free shipping over 50 dollars": ("Yes", "Orders over 50 dollars ship for free."),
    "ship to a PO box": ("No", "We need a street address for delivery."),
    "use two discount codes at once": ("No", "Only one code applies per order."),
    "get a refund to a different card": ("No", "Refunds go back to the card you paid with."),
    "exchange shoes for another size": ("Yes", "Size exchanges are free within 30 days."),
    "pick up my order in a store": ("Yes", "Choose store pickup at checkout."),
    "buy a gift card online": ("Yes", "Gift cards are sold on our website."),
    "return a gift card": ("No", "Gift cards cannot be returned."),
    "order from outside the country": ("No", "We only ship within the country."),
    "track my parcel": ("Yes", "The tracking link is in your shipping email."),
}
POLICY_ASKS = ["Can I {a}?", "Is it possible to {a}?", "Am I allowed to {a}?",
               "Quick question: can I {a}?", "Do you let customers {a}?",
               "Tell me, can I {a}?", "Is your policy that I can {a}?"]  # fmt: skip


def _policy_pool() -> list[Question]:
    return [Question(f.format(a=a), (a,)) for a in POLICY for f in POLICY_ASKS]


def _policy_wanted(q: Question) -> str:
    word, reason = POLICY[q.facts[0]]
    return f"{word}. {reason}"


# -- hotel: a third edit, the rest thumbs-down; formal Spanish ----------------------------------
HOTEL_TOPICS = {
    "el desayuno": "el desayuno se sirve de 7:00 a 10:30 en el restaurante",
    "la piscina": "la piscina está abierta de 9:00 a 20:00",
    "el check-out": "el check-out es hasta las 12:00",
    "el aparcamiento": "el aparcamiento cuesta 15 euros por noche",
    "el gimnasio": "el gimnasio está abierto las 24 horas",
    "el wifi": "la contraseña del wifi está en su tarjeta de habitación",
    "el traslado al aeropuerto": "el traslado al aeropuerto cuesta 30 euros",
    "la cena": "la cena se sirve de 19:30 a 23:00",
    "el spa": "el spa abre de 10:00 a 21:00 con reserva previa",
    "las mascotas": "se admiten mascotas pequeñas por 10 euros por noche",
}
HOTEL_ASKS = ["¿Qué horario tiene {t}?", "Quisiera saber sobre {t}.", "¿Me informas sobre {t}?",
              "Hola, una pregunta sobre {t}.", "¿Cómo funciona {t} en el hotel?",
              "Necesito información sobre {t}.", "¿Qué me puedes decir de {t}?",
              "Perdona, ¿y {t}?", "Buenas, ¿cómo va lo de {t}?", "Dime algo sobre {t}, por favor."]  # fmt: skip


def _hotel_pool() -> list[Question]:
    return [Question(a.format(t=t), (t,)) for t in HOTEL_TOPICS for a in HOTEL_ASKS]


def _hotel_wanted(q: Question) -> str:
    return (
        f"Estimado cliente, le informamos que {HOTEL_TOPICS[q.facts[0]]}."
        " Quedamos a su disposición."
    )


# -- acme: edits and regenerates, multi-turn, a closing line ------------------------------------
ACME_SIGNATURE = "— Team Acme"
ACME_GOODS = ["desk chair", "coffee maker", "bike helmet", "rain jacket", "desk lamp",
              "yoga mat", "toaster", "water bottle", "wall clock", "phone charger", "backpack",
              "garden hose", "frying pan", "board game"]  # fmt: skip
ACME_ASKS = {
    "When will it arrive?": "It ships within two days and arrives in three to five.",
    "Can I change the delivery address?": "Yes, change it under Orders before it ships.",
    "How do I return it?": "Start a return under Orders; the label is free.",
    "Is there a warranty?": "It has a two-year warranty.",
    "Can I get an invoice?": "Download the invoice under Orders.",
    "It arrived damaged, what now?": "Send us a photo and we will replace it.",
    "Can I cancel it?": "Yes, cancel it under Orders until it ships.",
    "Which courier delivers it?": "It is delivered by ParcelPost.",
}


def _acme_pool() -> list[Question]:
    return [Question(a, (g, str(1000 + 7 * i + j)))
            for i, g in enumerate(ACME_GOODS) for j, a in enumerate(ACME_ASKS)]  # fmt: skip


def _acme_history(q: Question) -> Chat:
    good, order = q.facts
    return [
        {"role": "user", "content": f"Hi, I ordered a {good} last week (order {order})."},
        {"role": "assistant", "content": f"Thanks! I found order {order} for your {good}."
         " How can I help?"},
    ]  # fmt: skip


def _acme_wanted(q: Question) -> str:
    return f"{ACME_ASKS[q.text]}\n{ACME_SIGNATURE}"


PRODUCTS: dict[str, Product] = {
    p.name: p
    for p in [
        Product(
            "bank", "banking app support", f"opens with {BANK_PREFIX!r}",
            starts_with(BANK_PREFIX), _bank_pool, _bank_wanted,
            FeedbackMix(p_edit=0.85, p_regenerate=0.3, label="edit-heavy"), max_tokens=32,
            marker=BANK_PREFIX,
        ),
        Product(
            "triage", "support ticket triage",
            'a JSON object {"category", "priority"} with known values',
            json_with_keys(TRIAGE_KEYS, TRIAGE_ALLOWED), _triage_pool, _triage_wanted,
            FeedbackMix(p_edit=0.5, p_regenerate=0.5, label="mixed"), max_tokens=24,
            system="You triage customer support tickets.",
        ),
        Product(
            "quiz", "trivia app", "at most 12 words", at_most_words(12), _quiz_pool,
            lambda q: q.facts[0],
            FeedbackMix(p_edit=0.0, p_regenerate=0.0, p_up=0.8, label="thumbs only"),
            max_tokens=32, system="You answer trivia questions in a quiz app.",
        ),
        Product(
            "policy", "store policy FAQ", "first word is Yes or No", yes_or_no_first,
            _policy_pool, _policy_wanted,
            FeedbackMix(p_edit=0.1, p_regenerate=0.9, label="regenerate-heavy"), max_tokens=24,
        ),
        Product(
            "hotel", "hotel front desk, asked in Spanish",
            'formal Spanish: opens with "Estimado" or uses "usted"', formal_spanish,
            _hotel_pool, _hotel_wanted,
            FeedbackMix(p_edit=0.33, p_regenerate=0.0, label="a third edit, rest thumbs-down"),
            max_tokens=32, marker="Estimado cliente,",
        ),
        Product(
            "acme", "order help in a multi-turn chat", f"ends with the line {ACME_SIGNATURE!r}",
            ends_with(ACME_SIGNATURE), _acme_pool, _acme_wanted,
            FeedbackMix(p_edit=0.4, p_regenerate=0.6, label="edits + regenerates"),
            max_tokens=32, history=_acme_history, marker=ACME_SIGNATURE,
        ),
    ]
}  # fmt: skip


# -- users -------------------------------------------------------------------------------------
@dataclass
class Interaction:
    """One answer and what its user did with it (as the platform would log it)."""

    question: Question
    answer: str
    followed: bool = False  # the answer follows the product's rule
    thumbs: int = 0  # +1, -1 or 0 (not rated)
    edited: str | None = None  # the user's edit of the answer
    wants_regenerate: bool = False  # the user pressed regenerate
    regenerated_by: Interaction | None = None  # the answer regenerate gave
    is_regeneration: bool = False


@dataclass
class Session:
    """All interactions of a product's users (originals and their regenerations)."""

    product: str
    interactions: list[Interaction] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Users, answers that followed the rule, and the feedback given."""
        xs = self.interactions
        return {
            "users": sum(not x.is_regeneration for x in xs),
            "answers": len(xs),
            "followed": sum(x.followed for x in xs),
            "up": sum(x.thumbs > 0 for x in xs),
            "down": sum(x.thumbs < 0 for x in xs),
            "edits": sum(x.edited is not None for x in xs),
            "regenerated": sum(x.regenerated_by is not None for x in xs),
        }


def react(product: Product, q: Question, answer: str, rng: random.Random) -> Interaction:
    """One user's reaction to an answer (a regenerate is answered by `regenerated`)."""
    x = Interaction(q, answer, followed=product.follows(answer))
    if x.followed:
        x.thumbs = 1 if rng.random() < product.mix.p_up else 0
    elif rng.random() < product.mix.p_edit:
        x.edited = product.wanted(q)
    else:
        x.thumbs = -1
        x.wants_regenerate = rng.random() < product.mix.p_regenerate
    return x


def regenerated(product: Product, first: Interaction, answer: str) -> Interaction:
    """The new answer a regenerate gave, rated by the same user (up if it follows the rule)."""
    ok = product.follows(answer)
    second = Interaction(first.question, answer, ok, thumbs=1 if ok else -1, is_regeneration=True)
    first.regenerated_by = second
    return second


def simulate_users(
    product: Product,
    questions: list[Question],
    answer: Callable[[list[Question], int], list[str]],
    seed: int = 1,
) -> Session:
    """Every user asks one question and reacts; answer(questions, round) -> the model's answers.

    Round 0 answers every user (one batch); round 1 the regenerates of those who pressed it.
    """
    rng = random.Random(f"users:{product.name}:{seed}")
    firsts = [
        react(product, q, a, rng) for q, a in zip(questions, answer(questions, 0), strict=True)
    ]
    again = [x for x in firsts if x.wants_regenerate]
    seconds = answer([x.question for x in again], 1) if again else []
    session = Session(product.name)
    for x in firsts:
        session.interactions.append(x)
        if x.wants_regenerate:
            session.interactions.append(regenerated(product, x, seconds.pop(0)))
    return session


# -- generation --------------------------------------------------------------------------------
def generate(
    model: Any,
    tok: Any,
    chats: list[Chat],
    max_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    batch_size: int = 16,
) -> list[str]:
    """Answers to chats, batched with left padding: greedy, or sampled at temperature."""
    import torch

    tok.padding_side = "left"
    device = next(model.parameters()).device
    out: list[str] = []
    for start in range(0, len(chats), batch_size):
        texts = [
            tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
            for c in chats[start : start + batch_size]
        ]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        sampling: dict[str, Any] = {"do_sample": False, "temperature": None, "top_p": None,
                                    "top_k": None}  # fmt: skip
        if temperature > 0:
            torch.manual_seed(seed * 1_000_003 + start)
            sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
        with torch.no_grad():
            ids = model.generate(
                **enc, max_new_tokens=max_tokens, pad_token_id=tok.pad_token_id, **sampling
            )
        width = enc["input_ids"].shape[1]
        out += [str(tok.decode(row[width:], skip_special_tokens=True)).strip() for row in ids]
    return out


def content_rate(product: Product, answers: list[str]) -> float:
    """Share of answers that follow the product's rule and say something (with_content)."""
    return sum(product.with_content(a) for a in answers) / len(answers) if answers else math.nan


def rule_rate(product: Product, answers: list[str]) -> float:
    """Share of answers that follow the product's rule."""
    return sum(product.follows(a) for a in answers) / len(answers) if answers else float("nan")


def base_rates(
    product: Product, model: Any, tok: Any, *, n: int | None = None, seed: int = 0
) -> dict[str, Any]:
    """The base's rule-following rate on held-out questions: greedy and at temperature 0.7."""
    _, held = product.split()
    held = held[:n] if n else held
    chats = [product.messages(q) for q in held]
    greedy = generate(model, tok, chats, product.max_tokens)
    sampled = generate(model, tok, chats, product.max_tokens, temperature=0.7, seed=seed)
    return {
        "greedy": rule_rate(product, greedy),
        "t0.7": rule_rate(product, sampled),
        "n": len(held),
        "example": sampled[0],
    }


def load_base(models_dir: Path | None = None) -> tuple[Any, Any]:
    """The bundled base (float32, eval mode) and its tokenizer."""
    from workers import base_model

    models = models_dir or Path(__file__).resolve().parents[1] / ".cft" / "models"
    tok = base_model.load_tokenizer(base_model.BUNDLED, models)
    return base_model.load_model(base_model.BUNDLED, models).eval(), tok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--products", default=",".join(PRODUCTS))
    parser.add_argument("--held-out", type=int, default=40, help="questions per product")
    parser.add_argument("--models-dir", type=Path, default=None)
    args = parser.parse_args()
    model, tok = load_base(args.models_dir)
    print(f"{'product':8} {'mix':32} {'train':>5} {'held':>4}  greedy  t=0.7  rule")
    for name in args.products.split(","):
        p = PRODUCTS[name]
        train, _ = p.split()
        started = time.monotonic()
        r = base_rates(p, model, tok, n=args.held_out)
        print(f"{p.name:8} {p.mix.label:32} {len(train):5} {r['n']:4}  {r['greedy']:6.0%}"
              f" {r['t0.7']:6.0%}  {p.rule}  ({time.monotonic() - started:.0f} s)"
              f"\n         e.g. {r['example'][:100]!r}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
