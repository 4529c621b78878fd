"""Which training method, from which feedback, with which settings, learns a product's rule?

For each simulated product (bench/products.py) the loop's view of ~50 users on the base model is
simulated: the base answers at temperature 0.7 (the engine's sampling: full vocabulary, top_p 1)
with a short budget, and the product's users react: an edit gives an SFT example (the wanted
answer) and an edit pair (wanted over original); a thumbs-up / thumbs-down a KTO example; a
regenerate a regenerate pair (second over first) when the second answer is not rated down.
From the whole signal, candidate methods:

    sft   SFT on every desirable answer (edits' wanted answers + thumbs-up answers)
    kto   KTO on everything (desirable: wanted answers, thumbs-up answers; undesirable:
          thumbs-down answers, regenerated-away answers)
    orpo  ORPO on the pairs (edit pairs + regenerate pairs), when there are any

and candidate settings (every run: `workers.trainer.train.train_adapter` on the CPU, the
trainer's own code path, NF4 base, LoRA r 8 on q/k/v/o):

    calibrated  lr 2e-3 constant, no warmup, batch 8 x 1, steps ceil(3 n / 8) in [8, 60],
                max_length 256
    lr5e-4      the same with lr 5e-4
    lr5e-3      the same with lr 5e-3
    default     today's size-scaled defaults (app.loop.method.hyperparameters)

Each adapter is scored on the product's held-out questions: the share of greedy answers (the
product's max_tokens) that follow its rule, against the base's share, and the mean token loss
of the held-out wanted answers (base -> adapter). The table is printed as runs finish and
written to bench/results/method_settings.md (and .json).

    PYTHONPATH=. .venv/bin/python bench/method_settings.py [--plan default] [--products a,b]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# bench/datasets.py would shadow the datasets package TRL imports: drop bench/ from the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.products import (  # noqa: E402
    PRODUCTS,
    Chat,
    Product,
    Session,
    content_rate,
    generate,
    load_base,
    rule_rate,
    simulate_users,
)

RESULTS = ROOT / "bench" / "results"
SAMPLE_TEMPERATURE = 0.7
SAMPLE_MAX_TOKENS = 32  # what the simulated users are served (the demo serves 12)


# -- settings ----------------------------------------------------------------------------------
def calibrated_steps(n: int, epochs: float = 3.0, batch: int = 8) -> int:
    """ceil(epochs * n / batch), kept within [8, 60]."""
    return max(8, min(60, math.ceil(epochs * n / batch)))


def settings(name: str, method: str, n: int) -> dict[str, Any]:
    """The hyperparameters of one named setting for a run of method on n examples."""
    if name == "default":
        from app.loop.method import hyperparameters

        return hyperparameters(method, n)
    lr = {"calibrated": 2e-3, "lr5e-4": 5e-4, "lr5e-3": 5e-3}[name]
    return {
        "learning_rate": lr, "lr_scheduler": "constant", "warmup": 0.0, "batch_size": 8,
        "grad_accum": 1, "max_steps": calibrated_steps(n), "max_length": 256,
    }  # fmt: skip


def describe(hp: dict[str, Any]) -> str:
    """A short line for a settings dict."""
    steps = hp.get("max_steps", -1)
    shape = f"{hp.get('batch_size', 1)}x{hp.get('grad_accum', 16)}"
    length = f" {steps} steps" if steps and steps > 0 else f" {hp.get('epochs', 3):g} ep"
    sched = hp.get("lr_scheduler", "cosine")
    return f"lr {hp['learning_rate']:.2g} {sched}, batch {shape},{length}"


# -- the signal --------------------------------------------------------------------------------
def _turn(text: str) -> Chat:
    return [{"role": "assistant", "content": text}]


def build_signal(p: Product, s: Session) -> dict[str, list[dict[str, Any]]]:
    """The training sets each method gets from the whole signal of one product's users."""
    sft: list[dict[str, Any]] = []
    kto: list[dict[str, Any]] = []
    pairs: list[dict[str, Any]] = []
    for x in s.interactions:
        prompt = p.messages(x.question)
        if x.edited is not None:
            sft.append({"messages": prompt + _turn(x.edited)})
            kto.append({"prompt": prompt, "completion": _turn(x.edited), "label": True})
            pairs.append({"prompt": prompt, "chosen": _turn(x.edited), "rejected": _turn(x.answer),
                          "kind": "edit"})  # fmt: skip
        if x.thumbs > 0:
            sft.append({"messages": prompt + _turn(x.answer)})
            kto.append({"prompt": prompt, "completion": _turn(x.answer), "label": True})
        elif x.thumbs < 0 or x.regenerated_by is not None:
            kto.append({"prompt": prompt, "completion": _turn(x.answer), "label": False})
        second = x.regenerated_by
        if second is not None and second.thumbs >= 0:
            pairs.append({"prompt": prompt, "chosen": _turn(second.answer),
                          "rejected": _turn(x.answer), "kind": "regen"})  # fmt: skip
    return {"sft": sft, "kto": kto, "orpo": pairs}


def usable(method: str, rows: list[dict[str, Any]]) -> bool:
    """Whether a method can train on rows (KTO needs both labels; at least 4 examples)."""
    if method == "kto":
        return len(rows) >= 4 and len({r["label"] for r in rows}) == 2
    return len(rows) >= 4


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


# -- the experiment ----------------------------------------------------------------------------
@dataclass
class ProductData:
    """One product's simulated signal, its held-out set and the base's scores on it."""

    product: Product
    counts: dict[str, int]
    signal: dict[str, list[dict[str, Any]]]
    held_chats: list[Chat]
    held_wanted: list[dict[str, Any]]
    base_rate: float
    base_loss: float
    seconds: float


def heldout_loss(model: Any, tok: Any, examples: list[dict[str, Any]]) -> float:
    from workers.evaluator.scoring import heldout_metrics

    return float(heldout_metrics(model, tok, "sft", examples)["loss"])


def prepare(
    p: Product, model: Any, tok: Any, users: int, held_out: int, cache: Path
) -> ProductData:
    """Simulate the product's users on the base; score the base on the held-out questions.

    The result is kept in cache (a JSON file per product and size) and read from there by a
    later invocation: the simulation is deterministic, and this spares its minutes.
    """
    started = time.monotonic()
    train_qs, held_qs = p.split()
    held = held_qs[:held_out]
    chats = [p.messages(q) for q in held]
    wanted = [{"messages": c + _turn(p.wanted(q))} for c, q in zip(chats, held, strict=True)]
    path = cache / f"{p.name}-users{users}-held{held_out}.json"
    if path.exists():
        saved = json.loads(path.read_text())
        return ProductData(p, saved["counts"], saved["signal"], chats, wanted,
                           saved["base_rate"], saved["base_loss"], saved["seconds"])  # fmt: skip
    asked = [train_qs[i % len(train_qs)] for i in range(users)]

    def answer(qs: list[Any], round_: int) -> list[str]:
        chats = [p.messages(q) for q in qs]
        return generate(model, tok, chats, SAMPLE_MAX_TOKENS, temperature=SAMPLE_TEMPERATURE,
                        seed=1000 * round_ + 17)  # fmt: skip

    session = simulate_users(p, asked, answer, seed=1)
    signal = build_signal(p, session)
    greedy = generate(model, tok, chats, p.max_tokens)
    d = ProductData(
        p, session.counts(), signal, chats, wanted,
        base_rate=rule_rate(p, greedy),
        base_loss=heldout_loss(model, tok, wanted),
        seconds=time.monotonic() - started,
    )  # fmt: skip
    cache.mkdir(parents=True, exist_ok=True)
    saved = {"counts": d.counts, "signal": signal, "base_rate": d.base_rate,
             "base_loss": d.base_loss, "seconds": d.seconds, "base_greedy": greedy}  # fmt: skip
    path.write_text(json.dumps(saved, ensure_ascii=False))
    return d


def train_and_score(
    d: ProductData, method: str, setting: str, model: Any, tok: Any, models_dir: Path,
    workdir: Path,
) -> dict[str, Any]:  # fmt: skip
    """Train one adapter with train_adapter and score it on the held-out questions."""
    from peft import PeftModel

    from workers import base_model
    from workers.trainer.train import Progress, train_adapter

    rows = d.signal[method]
    n = len(rows)
    hp = settings(setting, method, n)
    train_path = write_jsonl(workdir / d.product.name / f"{method}.train.jsonl",
                             [{k: v for k, v in r.items() if k != "kind"} for r in rows])  # fmt: skip
    out_dir = workdir / d.product.name / f"{method}-{setting}"
    shown = {"at": time.monotonic()}

    def progress(pr: Progress) -> None:
        if pr.step and (time.monotonic() - shown["at"] > 20 or pr.step == pr.total):
            shown["at"] = time.monotonic()
            loss = f"{pr.loss:.3f}" if pr.loss is not None else "-"
            eta = f"{pr.eta_s:.0f}s" if pr.eta_s is not None else "-"
            print(f"      step {pr.step}/{pr.total} loss {loss} eta {eta}", flush=True)

    result = train_adapter(
        method, train_path, None, out_dir, base_model=base_model.BUNDLED, models_dir=models_dir,
        params=hp, progress_cb=progress,
    )  # fmt: skip
    started = time.monotonic()
    peft = PeftModel.from_pretrained(model, str(out_dir))
    peft.eval()
    try:
        answers = generate(peft, tok, d.held_chats, d.product.max_tokens)
        loss = heldout_loss(peft, tok, d.held_wanted)
    finally:
        peft.unload()
        for attr in ("peft_config", "_hf_peft_config_loaded"):
            if attr in vars(model):
                delattr(model, attr)
    shutil.rmtree(out_dir, ignore_errors=True)
    m = result.metrics
    return {
        "product": d.product.name,
        "mix": d.product.mix.label,
        "method": method,
        "setting": setting,
        "settings": describe(hp),
        "hyperparameters": hp,
        "n": n,
        "steps": m["steps"],
        "train_s": m["train_seconds"],
        "train_loss_first": m.get("loss_first"),
        "train_loss_last": m.get("loss_last"),
        "base_rate": d.base_rate,
        "rate": rule_rate(d.product, answers),
        "base_loss": d.base_loss,
        "loss": loss,
        "eval_s": round(time.monotonic() - started, 1),
        "examples": answers[:3],
        "answers": answers,
        "distinct": len(set(answers)) / len(answers),
    }


# -- plans -------------------------------------------------------------------------------------
METHODS = ("sft", "kto", "orpo")


def plan(name: str, products: list[str]) -> list[tuple[str, str, str]]:
    """(product, method, setting) runs in the order they are run (the main questions first).

    default: SFT with the calibrated rule on every product; an lr sweep (and today's defaults)
    of SFT on bank; ORPO and KTO with the calibrated rule on every product with their signal
    (bank's KTO set is its SFT set plus a few thumbs-down, so it is left out); the lr sweep of
    SFT on acme; today's defaults for KTO on the thumbs-only quiz.
    calibrated: every method with the calibrated rule on every product.
    """
    if name == "calibrated":
        return [(p, m, "calibrated") for p in products for m in METHODS]
    if name != "default":
        raise SystemExit(f"unknown plan {name!r}")
    sweep = ("lr5e-4", "lr5e-3", "default")
    runs = [(p, "sft", "calibrated") for p in products]
    runs += [("bank", "sft", s) for s in sweep]
    runs += [(p, "orpo", "calibrated") for p in products if p != "quiz"]
    runs += [(p, "kto", "calibrated") for p in products if p != "bank"]
    runs += [("acme", "sft", s) for s in sweep]
    runs += [("quiz", "kto", "default")]
    return [r for r in runs if r[0] in products]


# -- report ------------------------------------------------------------------------------------
def pct(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.0%}"


def row_line(r: dict[str, Any]) -> str:
    return (
        f"| {r['product']} | {r['mix']} | {r['method']} | {r['setting']}: {r['settings']} |"
        f" {r['n']} | {r['steps']} | {r['train_s']:.0f} | {pct(r['base_rate'])} →"
        f" **{pct(r['rate'])}** | {pct(_content(r))} | {pct(r.get('distinct'))} |"
        f" {r['base_loss']:.2f} →"
        f" {r['loss']:.2f} |"
    )


def _content(r: dict[str, Any]) -> float | None:
    answers = r.get("answers")
    return content_rate(PRODUCTS[r["product"]], answers) if answers else None


def example_line(r: dict[str, Any]) -> str:
    text = r["examples"][0][:110].replace("\n", "⏎").replace("|", "\\|")
    return f"| {r['product']} | {r['method']} | {r['setting']} | `{text}` |"


def data_line(d: ProductData) -> str:
    c = d.counts
    pairs = d.signal["orpo"]
    edit_pairs = sum(r["kind"] == "edit" for r in pairs)
    kto = d.signal["kto"]
    return (
        f"| {d.product.name} | {d.product.mix.label} | {d.product.rule} | {c['users']} |"
        f" {c['followed']}/{c['answers']} | {c['up']} | {c['down']} | {c['edits']} | {c['regenerated']} |"
        f" {len(d.signal['sft'])} | {sum(r['label'] for r in kto)}/"
        f"{sum(not r['label'] for r in kto)} | {edit_pairs}+{len(pairs) - edit_pairs} |"
        f" {pct(d.base_rate)} |"
    )


def write_report(
    path: Path, data: dict[str, ProductData], rows: list[dict[str, Any]], meta: dict[str, Any]
) -> None:
    lines = [
        "# Method and settings across simulated products",
        "",
        "Written by `bench/method_settings.py` (see its docstring for the design); products in"
        " `bench/products.py`.",
        "",
        f"Machine: {meta['machine']}; {meta['users']} simulated users per product (base answers"
        f" at temperature {SAMPLE_TEMPERATURE}, {SAMPLE_MAX_TOKENS} tokens), {meta['held_out']}"
        " held-out questions per product (greedy, the product's max_tokens). Wall time so far:"
        f" {meta['wall_s'] + meta.get('earlier_wall_s', 0):.0f} s; load average at the start"
        f" {meta['load_start']}, now"
        f" {meta['load_now']}.",
        "",
        "## The signal each product's users gave the base",
        "",
        "| product | feedback mix | rule | users | answers following the rule | up | down | edits | regenerated | SFT rows |"
        " KTO desirable/undesirable | pairs (edit+regen) | base greedy rule rate |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *[data_line(d) for d in data.values()],
        "",
        "## Runs",
        "",
        "Rule rate: share of greedy held-out answers that follow the product's rule (base →"
        " adapter). Loss: mean token loss of the held-out wanted answers (base → adapter).",
        "",
        "With content: share that follows the rule and, for a rule asking for fixed text (bank's"
        " greeting, hotel's \"Estimado cliente,\", acme's closing line), has at least two words"
        " beside it. Distinct: share of distinct held-out answers (low: the adapter collapsed onto a few"
        " answers; not recorded for runs made before it was added).",
        "",
        "| product | feedback mix | method | settings | n | steps | train s | rule rate |"
        " with content | distinct | held-out loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *[row_line(r) for r in rows],
        "",
        "## The first held-out answer of each run (greedy)",
        "",
        "| product | method | settings | answer |",
        "|---|---|---|---|",
        *[example_line(r) for r in rows],
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    path.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": rows}, indent=1,
                                                    ensure_ascii=False) + "\n")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--products", default=",".join(PRODUCTS))
    parser.add_argument("--plan", default="default", help="default | calibrated")
    parser.add_argument("--runs", default="", help="explicit runs: product:method:setting,...")
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--held-out", type=int, default=40)
    parser.add_argument("--models-dir", type=Path, default=ROOT / ".cft" / "models")
    parser.add_argument("--out", type=Path, default=RESULTS / "method_settings.md")
    parser.add_argument("--budget-s", type=float, default=2100, help="start no run after this")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "cft-method-settings-data",
        help="cache of the simulated signal and base scores (reused when present)",
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="keep the runs already in --out's .json (a run done again replaces its row)",
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
            "users": args.users, "held_out": args.held_out,
            "load_start": [round(x, 1) for x in os.getloadavg()]}  # fmt: skip
    products = args.products.split(",")
    runs = (
        [tuple(r.split(":")) for r in args.runs.split(",")] if args.runs
        else plan(args.plan, products)
    )  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="cft-method-settings-"))
    random.seed(0)
    model, tok = load_base(args.models_dir)
    data: dict[str, ProductData] = {}
    rows: list[dict[str, Any]] = []
    previous: list[dict[str, Any]] = []
    if args.append and args.out.with_suffix(".json").exists():
        old = json.loads(args.out.with_suffix(".json").read_text())
        previous = old["runs"]
        meta["earlier_wall_s"] = old["meta"].get("earlier_wall_s", 0) + old["meta"]["wall_s"]
        meta["load_start"] = old["meta"]["load_start"]
        for name in dict.fromkeys(r["product"] for r in previous):
            runs.insert(0, (name, "", ""))  # prepare its data (from the cache) for the report

    def report() -> None:
        meta.update(
            wall_s=time.monotonic() - started, load_now=[round(x, 1) for x in os.getloadavg()]
        )
        done = {(r["product"], r["method"], r["setting"]) for r in rows}
        kept = [r for r in previous if (r["product"], r["method"], r["setting"]) not in done]
        write_report(args.out, data, kept + rows, meta)

    print(f"{len(runs)} runs planned; data in {workdir}", flush=True)
    for name in dict.fromkeys(r[0] for r in runs):
        d = prepare(PRODUCTS[name], model, tok, args.users, args.held_out, args.data_dir)
        data[name] = d
        c = d.counts
        print(f"[{time.monotonic() - started:5.0f}s] {name}: {c}, sft {len(d.signal['sft'])},"
              f" kto {len(d.signal['kto'])}, pairs {len(d.signal['orpo'])}; base greedy"
              f" {pct(d.base_rate)}, loss {d.base_loss:.2f} ({d.seconds:.0f} s)", flush=True)  # fmt: skip
    report()
    runs = [r for r in runs if r[1]]
    for i, (name, method, setting) in enumerate(runs, 1):
        d = data[name]
        elapsed = time.monotonic() - started
        if not usable(method, d.signal[method]):
            print(f"[{elapsed:5.0f}s] run {i}/{len(runs)} {name} {method}: skipped (no usable"
                  f" signal: {len(d.signal[method])} rows)", flush=True)  # fmt: skip
            continue
        if elapsed > args.budget_s:
            print(f"[{elapsed:5.0f}s] budget spent: run {i}/{len(runs)} and later not run")
            break
        print(f"[{elapsed:5.0f}s] run {i}/{len(runs)} {name} {method} {setting}"
              f" (n {len(d.signal[method])})", flush=True)  # fmt: skip
        r = train_and_score(d, method, setting, model, tok, args.models_dir, workdir)
        rows.append(r)
        print(f"    {row_line(r)}\n    e.g. {r['examples'][0][:90]!r}", flush=True)
        report()
    report()
    print(f"\nwritten {args.out} ({time.monotonic() - started:.0f} s)")
    print(args.out.read_text())
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
