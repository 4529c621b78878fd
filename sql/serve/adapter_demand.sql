-- Loading on demand: a router asks for an adapter that it was called for by name (a
-- fine-tuned model) and that no engine has; the reconciler loads it, as it loads canaries and
-- prods, until wanted_until (workers/reconciler).

COMMENT ON TABLE serve.adapter_demand IS
  'Adapters called by name (fine-tuned models) that the reconciler keeps loaded for a while.';
COMMENT ON COLUMN serve.adapter_demand.adapter_id IS 'The adapter (serve.adapter.id).';
COMMENT ON COLUMN serve.adapter_demand.wanted_until IS
  'Loaded until then (the last call plus CFT_ROUTER_DEMAND_TTL); unloaded after.';
COMMENT ON COLUMN serve.adapter_demand.requested_at IS 'When a router last asked for it.';

-- Ask for an adapter for p_for more (a router, as the owner); NOTIFY cft_adapter wakes the
-- reconcilers at commit.
CREATE OR REPLACE FUNCTION serve.demand_adapter(p_adapter_id text, p_for interval)
RETURNS void LANGUAGE sql AS $$
  INSERT INTO serve.adapter_demand AS d (adapter_id, wanted_until)
  VALUES (p_adapter_id, now() + p_for)
  ON CONFLICT (adapter_id) DO UPDATE
    SET wanted_until = greatest(d.wanted_until, excluded.wanted_until), requested_at = now();
  SELECT pg_notify('cft_adapter', p_adapter_id);
$$;
REVOKE ALL ON FUNCTION serve.demand_adapter(text, interval) FROM PUBLIC;
COMMENT ON FUNCTION serve.demand_adapter(text, interval) IS
  'Keep an adapter loaded for p_for from now (the reconciler loads it), and wake the reconcilers.';

GRANT SELECT ON serve.adapter_demand TO cft_release, cft_dashboard;
