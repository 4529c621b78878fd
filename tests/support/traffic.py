"""Synthetic experiment traffic, generated set-based in SQL (deterministic for a seed)."""

from __future__ import annotations

from typing import Any


def make_traffic(
    conn: Any,
    *,
    tenant_id: int,
    route: str,
    experiment: str,
    variant: str,
    adapter_id: str,
    n: int,
    p_up: float,
    rated: float = 0.8,
    p_regen: float = 0.1,
    p_edit: float = 0.05,
    ttft_ms: float = 200.0,
    seed: float = 0.5,
    hours: int = 48,
) -> None:
    """Insert n rows: rated share gets thumbs up with p_up (else down), the rest no feedback."""
    conn.execute("SELECT setseed(%s)", (seed,))
    conn.execute(
        """
        INSERT INTO obs.inference_log
          (request_id, tenant_id, route, adapter_id, experiment, variant, messages, completion,
           ttft_ms, tokens_in, tokens_out, fb_explicit, fb_regen, fb_edited, created_at)
        SELECT gen_random_uuid(), %(tenant_id)s, %(route)s, %(adapter_id)s, %(experiment)s,
               %(variant)s, '[{"role": "user", "content": "q"}]'::jsonb, 'a',
               (%(ttft)s * (0.5 + random()))::int, 5, 10 + (random() * 40)::int,
               CASE WHEN r1 < %(rated)s THEN CASE WHEN r2 < %(p_up)s THEN 1 ELSE -1 END END,
               random() < %(p_regen)s, random() < %(p_edit)s,
               now() - make_interval(secs => random() * %(hours)s * 3600)
          FROM (SELECT random() AS r1, random() AS r2 FROM generate_series(1, %(n)s)) g
        """,
        {
            "tenant_id": tenant_id,
            "route": route,
            "adapter_id": adapter_id,
            "experiment": experiment,
            "variant": variant,
            "ttft": ttft_ms,
            "rated": rated,
            "p_up": p_up,
            "p_regen": p_regen,
            "p_edit": p_edit,
            "n": n,
            "hours": hours,
        },
    )
