"""The decision rule's error bound holds under continuous monitoring (a small bench/sequential.py)."""

from __future__ import annotations

import math

from bench import sequential as sim


def test_aa_false_positives_stay_below_alpha_while_the_peeked_fixed_test_exceeds_it() -> None:
    alpha, runs = 0.05, 400
    bound = alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs)
    for share in (0.5, 0.2):
        r = sim.simulate(
            runs=runs, p_control=0.5, p_canary=0.5, batch=100, looks=100, share=share, seed=7
        )
        assert r.seq_reject <= bound, (share, r.seq_reject)
        # The same runs, peeked at the same looks with the fixed-horizon test: well past alpha.
        assert r.fixed_peek_reject > bound, (share, r.fixed_peek_reject)
        assert r.fixed_peek_reject > 3 * r.seq_reject


def test_true_effects_are_found_and_promoted() -> None:
    r = sim.simulate(runs=200, p_control=0.5, p_canary=0.6, batch=100, looks=100, seed=8)
    assert r.seq_reject > 0.95 and r.seq_promote == r.seq_reject
    assert 200 <= float(sorted(r.seq_users)[len(r.seq_users) // 2]) <= 4000
