"""Proof by simulation of the experiment policy's decision rule (BENCHMARKS.md, "Sequential
decisions (issue 21)").

Thousands of experiments on the thumbs-up rate, each checked after every batch of users, as the
experiments worker does:
  * A/A (no effect): the always-valid mSPRT (serve.canary_decision) rejects in <= alpha of the
    runs, while the fixed-horizon two-proportion z-test (obs.experiment_compare) peeked at the
    same times rejects in far more;
  * A/B with true effects of 5, 10 and 20 points: the users needed until the sequential rule
    decides (median, p90), beside the fixed-horizon sample for power 0.8.

The formulas are the SQL's (stats.msprt, stats.rate_var, obs.sequential_compare's variance of
a difference of rates); tests/integration/test_experiments_sequential.py checks that they agree
with the database on sampled inputs.

    .venv/bin/python bench/sequential.py                # 10000 runs per row (~1 min on 2 cores)
    .venv/bin/python bench/sequential.py --runs 2000    # quicker
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

TAU_RATE = 0.05  # the policy's mixing sd for rates when mixture_sd is NULL


def rate_var(x: np.ndarray, n: np.ndarray) -> np.ndarray:
    """stats.rate_var: per-observation variance of a rate, p~ = (x + 0.5) / (n + 1)."""
    pt = (x + 0.5) / (n + 1.0)
    return pt * (1 - pt)  # type: ignore[no-any-return]


def msprt(
    diff: np.ndarray, var: np.ndarray, tau: float, alpha: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """stats.msprt: (log_lr, p_value, ci_low, ci_high) of the normal-mixture mSPRT."""
    t2 = tau * tau
    llr = 0.5 * np.log(var / (var + t2)) + t2 * diff * diff / (2 * var * (var + t2))
    radius = np.sqrt(var * (var + t2) / t2 * (2 * math.log(1 / alpha) + np.log((var + t2) / var)))
    p = np.minimum(1.0, np.exp(-np.minimum(llr, 700)))
    return llr, p, diff - radius, diff + radius


def fixed_pvalue(x_c: np.ndarray, n_c: np.ndarray, x_k: np.ndarray, n_k: np.ndarray) -> np.ndarray:
    """obs.experiment_compare's two-proportion z-test (pooled se), two-sided p-value."""
    pooled = (x_c + x_k) / (n_c + n_k)
    se = np.sqrt(pooled * (1 - pooled) * (1 / n_c + 1 / n_k))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, (x_k / n_k - x_c / n_c) / se, 0.0)
    return 2 * stats.norm.sf(np.abs(z))  # type: ignore[no-any-return]


def fixed_sample_size(p: float, effect: float, alpha: float, power: float = 0.8) -> int:
    """stats.sample_size_prop: users per arm for the fixed-horizon test."""
    p2 = p + effect
    za, zb = stats.norm.ppf(1 - alpha / 2), stats.norm.ppf(power)
    num = za * math.sqrt(2 * ((p + p2) / 2) * (1 - (p + p2) / 2)) + zb * math.sqrt(
        p * (1 - p) + p2 * (1 - p2)
    )
    return math.ceil(num * num / (effect * effect))


@dataclass
class Result:
    """One simulated row."""

    runs: int
    seq_reject: float  # share of runs the sequential rule decided (promote or retire)
    seq_promote: float  # share it promoted
    fixed_peek_reject: float  # share the fixed test was significant at some look
    fixed_final_reject: float  # share the fixed test was significant at the last look only
    seq_users: np.ndarray  # total users until the sequential decision (decided runs)


def simulate(
    *,
    runs: int,
    p_control: float,
    p_canary: float,
    batch: int = 100,
    looks: int = 200,
    alpha: float = 0.05,
    tau: float = TAU_RATE,
    min_n: int = 100,
    share: float = 0.5,
    seed: int = 0,
) -> Result:
    """Runs of an experiment checked after every batch of users (canary share `share`)."""
    rng = np.random.default_rng(seed)
    nk_batch = round(batch * share)
    nc_batch = batch - nk_batch
    x_c = np.cumsum(rng.binomial(nc_batch, p_control, size=(runs, looks)), axis=1).astype(float)
    x_k = np.cumsum(rng.binomial(nk_batch, p_canary, size=(runs, looks)), axis=1).astype(float)
    n_c = np.broadcast_to(nc_batch * np.arange(1, looks + 1, dtype=float), (runs, looks))
    n_k = np.broadcast_to(nk_batch * np.arange(1, looks + 1, dtype=float), (runs, looks))
    diff = x_k / n_k - x_c / n_c
    var = rate_var(x_c, n_c) / n_c + rate_var(x_k, n_k) / n_k
    _, p_seq, _, _ = msprt(diff, var, tau, alpha)
    floor = np.minimum(n_c, n_k) >= min_n
    seq_hit = (p_seq <= alpha) & floor
    fixed_hit = (fixed_pvalue(x_c, n_c, x_k, n_k) < alpha) & floor
    users = batch * np.arange(1, looks + 1)

    seq_any = seq_hit.any(axis=1)
    first = seq_hit.argmax(axis=1)
    promoted = seq_any & (diff[np.arange(runs), first] > 0)
    fixed_any = fixed_hit.any(axis=1)
    return Result(
        runs=runs,
        seq_reject=float(seq_any.mean()),
        seq_promote=float(promoted.mean()),
        fixed_peek_reject=float(fixed_any.mean()),
        fixed_final_reject=float(fixed_hit[:, -1].mean()),
        seq_users=users[first[seq_any]],
    )


def _pct(a: np.ndarray, q: float) -> str:
    return f"{int(np.percentile(a, q)):>7d}" if a.size else "      -"


def main(argv: list[str] | None = None) -> int:
    """Print the A/A error rates and the A/B users-to-decision side by side."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=100, help="users between two looks")
    ap.add_argument("--looks", type=int, default=200)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--base", type=float, default=0.5, help="control thumbs-up rate")
    ap.add_argument("--seed", type=int, default=21)
    a = ap.parse_args(argv)
    horizon = a.batch * a.looks
    print(
        f"thumbs-up rate, base {a.base}; {a.runs} runs per row; a look every {a.batch} users, "
        f"{a.looks} looks (up to {horizon} users); alpha {a.alpha}; mSPRT tau {TAU_RATE}"
    )
    print()
    print("A/A (no effect): share of runs that ever declared a difference")
    print(
        f"{'canary share':>12} {'min_n/arm':>9} | {'sequential':>10} {'3 se':>6} | "
        f"{'fixed, peeked':>13} {'ratio':>6} | {'fixed, last look only':>21}"
    )
    for share, min_n in ((0.5, 100), (0.5, 1000), (0.2, 100)):
        r = simulate(
            runs=a.runs,
            p_control=a.base,
            p_canary=a.base,
            batch=a.batch,
            looks=a.looks,
            alpha=a.alpha,
            min_n=min_n,
            share=share,
            seed=a.seed,
        )
        se3 = 3 * math.sqrt(a.alpha * (1 - a.alpha) / a.runs)
        ratio = r.fixed_peek_reject / max(r.seq_reject, 1e-9)
        print(
            f"{share:>12.0%} {min_n:>9d} | {r.seq_reject:>10.4f} {se3:>6.4f} | "
            f"{r.fixed_peek_reject:>13.4f} {ratio:>5.1f}x | {r.fixed_final_reject:>21.4f}"
        )
    print()
    print("A/B (true effect, 50/50 split, min_n 100/arm): total users until a decision")
    print(
        f"{'effect':>6} | {'decided':>7} {'promoted':>8} {'median':>7} {'p90':>7} | "
        f"{'fixed n (power 0.8)':>19} {'median/fixed':>12} {'p90/fixed':>9}"
    )
    for effect in (0.05, 0.10, 0.20):
        r = simulate(
            runs=a.runs,
            p_control=a.base,
            p_canary=a.base + effect,
            batch=a.batch,
            looks=a.looks,
            alpha=a.alpha,
            seed=a.seed + 1,
        )
        fixed_total = 2 * fixed_sample_size(a.base, effect, a.alpha)
        med = float(np.median(r.seq_users)) if r.seq_users.size else float("nan")
        p90 = float(np.percentile(r.seq_users, 90)) if r.seq_users.size else float("nan")
        print(
            f"{effect * 100:>4.0f}pt | {r.seq_reject:>7.1%} {r.seq_promote:>8.1%} "
            f"{_pct(r.seq_users, 50)} {_pct(r.seq_users, 90)} | {fixed_total:>19d} "
            f"{med / fixed_total:>12.2f} {p90 / fixed_total:>9.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
