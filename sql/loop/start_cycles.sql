-- Limits of the loop: what holds a triggered cycle back. One row per limit with blocking = true
-- when it holds now; a forget cycle (the prod must be replaced) is not held by min_interval or
-- the cool-down (forget_bypasses), only by the switches, the one-cycle rule, max cycles per day
-- (so a replacement the gate keeps refusing does not retrain without end) and the capacity.
CREATE OR REPLACE FUNCTION loop.limits(p_tenant int, p_route text)
RETURNS TABLE (limit_name text, blocking boolean, value float8, threshold float8,
               forget_bypasses boolean, line text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  p        loop.policy := loop.effective_policy(p_tenant, p_route);
  k        loop.control;
  v_active bigint;
  v_day    bigint;
  v_last   timestamptz := loop.last_cycle_at(p_tenant, p_route);
  v_reject timestamptz;
  v_tenant bigint;
  v_all    bigint;
BEGIN
  SELECT * INTO k FROM loop.control;
  SELECT id INTO v_active FROM loop.cycle
   WHERE tenant_id = p_tenant AND route = p_route
     AND state NOT IN ('promoted', 'rejected', 'rolled_back', 'failed');
  SELECT count(*) INTO v_day FROM loop.cycle
   WHERE tenant_id = p_tenant AND route = p_route AND created_at > now() - interval '1 day';
  SELECT max(finished_at) INTO v_reject FROM loop.cycle
   WHERE tenant_id = p_tenant AND route = p_route AND state IN ('rejected', 'rolled_back');
  -- Training capacity: runs queued or running, plus loop cycles about to enqueue one.
  SELECT count(*) INTO v_tenant FROM (
    SELECT id::text FROM train.training_run
     WHERE tenant_id = p.tenant_id AND status IN ('queued', 'running')
    UNION ALL
    SELECT id::text FROM loop.cycle
     WHERE tenant_id = p.tenant_id AND state IN ('triggered', 'snapshot')) x;
  SELECT count(*) INTO v_all FROM (
    SELECT id::text FROM train.training_run WHERE status IN ('queued', 'running')
    UNION ALL
    SELECT id::text FROM loop.cycle WHERE state IN ('triggered', 'snapshot')) x;

  RETURN QUERY VALUES
    ('kill_switch', k.paused, NULL::float8, NULL::float8, false,
     CASE WHEN k.paused THEN format('the loop is stopped everywhere by %s at %s: %s',
                                    coalesce(k.changed_by, '?'), k.changed_at, coalesce(k.reason, 'no reason'))
          ELSE 'the loop runs (no global stop)' END),
    ('enabled', NOT p.enabled, NULL, NULL, false,
     CASE WHEN p.enabled THEN 'enabled' ELSE 'the loop of this route is not enabled' END),
    ('paused', p.paused, NULL, NULL, false,
     CASE WHEN p.paused THEN 'paused: ' || coalesce(p.paused_reason, 'no reason given') ELSE 'not paused' END),
    ('one_cycle', v_active IS NOT NULL, v_active::float8, NULL, false,
     CASE WHEN v_active IS NOT NULL THEN format('cycle %s is in flight', v_active)
          ELSE 'no cycle in flight' END),
    ('max_cycles_per_day', v_day >= p.max_cycles_per_day, v_day::float8, p.max_cycles_per_day::float8,
     false, format('%s of %s cycles in the last 24 h', v_day, p.max_cycles_per_day)),
    ('min_interval', coalesce(v_last > now() - p.min_interval, false),
     extract(epoch FROM now() - v_last)::float8, extract(epoch FROM p.min_interval)::float8, true,
     CASE WHEN v_last IS NULL THEN 'no cycle yet'
          ELSE format('last cycle %s ago (at most one per %s)', date_trunc('second', now() - v_last),
                      p.min_interval) END),
    ('cooldown_after_reject', coalesce(v_reject > now() - p.cooldown_after_reject, false),
     extract(epoch FROM now() - v_reject)::float8, extract(epoch FROM p.cooldown_after_reject)::float8,
     true,
     CASE WHEN v_reject IS NULL THEN 'no rejected candidate'
          ELSE format('last rejection %s ago (cool-down %s)', date_trunc('second', now() - v_reject),
                      p.cooldown_after_reject) END),
    ('tenant_training', v_tenant >= p.max_concurrent_training, v_tenant::float8,
     p.max_concurrent_training::float8, false,
     format('%s of %s training runs of the tenant queued or running', v_tenant, p.max_concurrent_training)),
    ('global_training', v_all >= k.max_concurrent_training, v_all::float8,
     k.max_concurrent_training::float8, false,
     format('%s of %s training runs queued or running on the platform', v_all,
            k.max_concurrent_training));
END
$$;
COMMENT ON FUNCTION loop.limits(int, text) IS
  'What holds a new loop cycle of the tenant''s route back now (blocking = true): switches, one cycle at a '
  'time, max cycles per day, min_interval, cool-down after a rejection, training capacity.';

-- Start the cycles that are due: for every enabled, unpaused route (rows locked, SKIP LOCKED:
-- concurrent callers split the routes), the first trigger that fired, unless a limit holds.
-- Returns the cycles started. Nothing starts while loop.control.paused.
CREATE OR REPLACE FUNCTION loop.start_due_cycles() RETURNS SETOF loop.cycle
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_tenant int;
  v_route text;
  v_trig  jsonb;
  v_lims  jsonb;
  v_fired record;
  v_block text;
  c       loop.cycle;
  p       loop.policy;
BEGIN
  IF (SELECT paused FROM loop.control) THEN
    RETURN;
  END IF;
  -- ("loop" quoted: unquoted, PL/pgSQL would read it as the end of the FOR's query)
  FOR v_tenant, v_route IN SELECT q.tenant_id, q.route FROM "loop".policy q
                            WHERE q.enabled AND NOT q.paused
                            ORDER BY q.tenant_id, q.route FOR UPDATE SKIP LOCKED LOOP
    SELECT jsonb_agg(to_jsonb(t)) INTO v_trig FROM loop.triggers(v_tenant, v_route) t;
    SELECT e->>'trigger' AS trigger, e->'detail' AS detail, e->>'line' AS line INTO v_fired
      FROM jsonb_array_elements(v_trig) e
     WHERE (e->>'fired')::boolean
     ORDER BY array_position(ARRAY['forget', 'decline', 'drift', 'volume', 'schedule'], e->>'trigger')
     LIMIT 1;
    v_trig := (SELECT jsonb_object_agg(e->>'trigger', e - 'trigger') FROM jsonb_array_elements(v_trig) e);
    CONTINUE WHEN v_fired.trigger IS NULL;
    SELECT jsonb_object_agg(l.limit_name, to_jsonb(l) - 'limit_name'),
           string_agg(l.line, '; ') FILTER (WHERE l.blocking
                                             AND NOT (v_fired.trigger = 'forget' AND l.forget_bypasses))
      INTO v_lims, v_block FROM loop.limits(v_tenant, v_route) l;
    CONTINUE WHEN v_block IS NOT NULL;
    p := loop.effective_policy(v_tenant, v_route);
    INSERT INTO loop.cycle (tenant_id, route, trigger, trigger_values, policy, forget_request_id)
    VALUES (p.tenant_id, v_route, v_fired.trigger,
            jsonb_build_object('fired', v_fired.trigger, 'line', v_fired.line,
                               'triggers', v_trig, 'limits', v_lims),
            to_jsonb(p), (v_fired.detail->>'forget_request_id')::bigint)
    ON CONFLICT DO NOTHING
    RETURNING * INTO c;
    IF c.id IS NOT NULL THEN
      INSERT INTO loop.cycle_event (cycle_id, tenant_id, from_state, to_state, inputs, note)
      VALUES (c.id, c.tenant_id, NULL, 'triggered', c.trigger_values, v_fired.line);
      RETURN NEXT c;
      c := NULL;
    END IF;
  END LOOP;
END
$$;
