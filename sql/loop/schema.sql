COMMENT ON TABLE loop.control IS
  'One row: paused = true stops every loop cycle from starting (cft loop stop-all); '
  'max_concurrent_training caps the queued + running training runs of all tenants.';
COMMENT ON COLUMN loop.control.id IS 'Always true: the key of the one row.';
COMMENT ON COLUMN loop.control.paused IS
  'The kill switch: true stops every loop cycle from starting (cycles in flight finish).';
COMMENT ON COLUMN loop.control.reason IS 'Why the loop was stopped (stopping needs one).';
COMMENT ON COLUMN loop.control.changed_by IS
  'Who changed the switch last: key <prefix> (API), cli, or the SQL session user.';
COMMENT ON COLUMN loop.control.changed_at IS 'When the switch was changed last.';
COMMENT ON COLUMN loop.control.max_concurrent_training IS
  'Platform cap: training runs queued or running, plus loop cycles '
  'about to queue one, of all tenants.';
COMMENT ON TABLE loop.policy IS
  'The loop of one route: when a cycle starts (triggers, limits), what it trains, how its canary '
  'is judged and watched. Every column has a default; no row = the defaults, loop disabled.';
COMMENT ON COLUMN loop.policy.enabled IS 'Off by default: no cycle starts until it is true.';
COMMENT ON COLUMN loop.policy.paused IS 'Holds new cycles of this route (cft loop pause); in-flight cycles finish.';
COMMENT ON COLUMN loop.policy.method IS 'NULL: chosen by the signal (app/loop/method.py); else pinned.';
COMMENT ON COLUMN loop.policy.min_new_examples IS
  'Volume trigger: usable examples of one signal (edits, regenerate pairs or thumbs) since the last cycle.';
COMMENT ON COLUMN loop.policy.min_interval IS 'At most one cycle start per this interval (a limit).';
COMMENT ON COLUMN loop.policy.max_interval IS 'Schedule trigger: a cycle at least this often (NULL: off).';
COMMENT ON COLUMN loop.policy.decline_alpha IS
  'Decline trigger: one-sided two-proportion z-test level (thumbs-up rate now vs after promotion).';
COMMENT ON COLUMN loop.policy.drift_distance IS
  'Drift trigger: cosine distance beyond which a recent prompt has no near training prompt.';
COMMENT ON COLUMN loop.policy.drift_share IS 'Drift trigger: share of far prompts that fires it.';
COMMENT ON COLUMN loop.policy.canary_pct IS 'Share of users the canary gets (at most serve.route.max_canary_pct).';
COMMENT ON COLUMN loop.policy.memory_tight IS 'Preference pairs train SimPO (no reference model) instead of DPO.';
COMMENT ON COLUMN loop.policy.hyperparameters IS
  'Overrides of the chosen hyperparameters (app.training.methods.Hyperparameters keys).';
COMMENT ON COLUMN loop.policy.route IS 'The route whose loop this is.';
COMMENT ON COLUMN loop.policy.tenant_id IS 'The route''s tenant.';
COMMENT ON COLUMN loop.policy.paused_reason IS 'Why the route is paused (loop.limits shows it).';
COMMENT ON COLUMN loop.policy.decline_enabled IS
  'Decline trigger on: a cycle when the prod''s thumbs-up rate falls significantly '
  'below its rate after promotion.';
COMMENT ON COLUMN loop.policy.decline_window IS
  'Decline trigger: length of the two windows compared (the first '
  'after promotion, and the latest).';
COMMENT ON COLUMN loop.policy.decline_min_n IS 'Decline trigger: rated rows each window needs.';
COMMENT ON COLUMN loop.policy.drift_enabled IS
  'Drift trigger on: a cycle when recent prompts lie far from the prod''s training prompts.';
COMMENT ON COLUMN loop.policy.drift_sample IS
  'Drift trigger: the route''s latest embedded prompts compared.';
COMMENT ON COLUMN loop.policy.drift_min_n IS
  'Drift trigger: recent embedded prompts needed before it may fire.';
COMMENT ON COLUMN loop.policy.max_cycles_per_day IS
  'Limit: cycles started for the route in the last 24 h.';
COMMENT ON COLUMN loop.policy.max_concurrent_training IS
  'Limit: the tenant''s training runs queued or running, plus its cycles about to queue one.';
COMMENT ON COLUMN loop.policy.cooldown_after_reject IS
  'Limit: no new cycle this long after a rejected or rolled-back one (a forget cycle is not held).';
COMMENT ON COLUMN loop.policy.canary_max_users IS
  'Canary budget: distinct users of the canary; when reached undecided, one final look decides.';
COMMENT ON COLUMN loop.policy.canary_max_duration IS
  'Canary budget: time since the canary opened; when reached undecided, one final look decides.';
COMMENT ON COLUMN loop.policy.decision_metric IS
  'The metric the canary is judged on (the always-valid test of serve.canary_decision); default '
  'acceptance_rate: of the answers with any feedback, the share accepted as they were (rated up, '
  'neither edited nor regenerated), so edits and regenerations count as much as thumbs.';
COMMENT ON COLUMN loop.policy.min_offline_gain IS
  'Held-out gain over what the route serves now (its prod, or the base) a candidate needs before '
  'its canary: a task suite''s pass rate or the held-out answer similarity, 0-1 (app/loop/offline.py).';
COMMENT ON COLUMN loop.policy.decision_alpha IS
  'Error bound of the canary decision, and of the watch against the previous prod.';
COMMENT ON COLUMN loop.policy.decision_min_n IS
  'Sample floor: no canary decision before both arms have this many (in the metric''s unit).';
COMMENT ON COLUMN loop.policy.watch_window IS
  'How long a new prod is watched after its promotion (0: no watch).';
COMMENT ON COLUMN loop.policy.watch_alpha IS
  'Level of the watch''s test when there is no previous prod '
  '(loop.watch_verdict, against the base''s traffic).';
COMMENT ON COLUMN loop.policy.watch_min_n IS
  'Rows each side of that test needs (rated rows for the thumbs-down rate).';
COMMENT ON COLUMN loop.policy.eval_timeout IS
  'How long a cycle waits for the evaluator''s results before it fails.';
COMMENT ON COLUMN loop.policy.created_at IS
  'When the row was written first; the schedule trigger counts from it before any cycle.';
COMMENT ON COLUMN loop.policy.updated_at IS 'Last change of the row (kept by trigger).';
COMMENT ON COLUMN loop.policy.updated_by IS
  'Who wrote it last through the API (key <prefix>) or the CLI (cli).';

-- The canary share may not exceed the route's ceiling (serve.route.max_canary_pct).
CREATE OR REPLACE FUNCTION loop.policy_check() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_max numeric;
BEGIN
  SELECT max_canary_pct INTO v_max FROM serve.route WHERE tenant_id = NEW.tenant_id AND name = NEW.route;
  IF v_max IS NOT NULL AND NEW.canary_pct > v_max THEN
    RAISE check_violation USING CONSTRAINT = 'loop_policy_canary_ceiling',
      MESSAGE = format('canary_pct %s is above the ceiling of route %s (max_canary_pct %s)',
                       NEW.canary_pct, NEW.route, v_max);
  END IF;
  NEW.updated_at := now();
  RETURN NEW;
END
$$;
CREATE OR REPLACE TRIGGER policy_check BEFORE INSERT OR UPDATE ON loop.policy
  FOR EACH ROW EXECUTE FUNCTION loop.policy_check();

-- A tenant's route, checked for functions that run with owner rights: the route must exist, and
-- a caller scoped to a tenant (the API's cft_app, cft.tenant_id set) may only ask about its own.
CREATE OR REPLACE FUNCTION loop.check_route(p_tenant int, p_route text) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM serve.route WHERE tenant_id = p_tenant AND name = p_route)
     OR p_tenant IS DISTINCT FROM coalesce(auth.current_tenant_id(), p_tenant) THEN
    RAISE EXCEPTION 'route % not found', p_route USING ERRCODE = 'no_data_found';
  END IF;
END
$$;

-- The effective policy of a route: its row, or the column defaults when it has none (an insert
-- rolled back inside a subtransaction: the defaults stay defined once, in the table above).
CREATE OR REPLACE FUNCTION loop.effective_policy(p_tenant int, p_route text) RETURNS loop.policy
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  p loop.policy;
BEGIN
  PERFORM loop.check_route(p_tenant, p_route);
  SELECT * INTO p FROM loop.policy WHERE tenant_id = p_tenant AND route = p_route;
  IF FOUND THEN
    RETURN p;
  END IF;
  BEGIN
    INSERT INTO loop.policy (route, tenant_id) VALUES (p_route, p_tenant) RETURNING * INTO p;
    RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = 'loop.effective_policy: undo';
  EXCEPTION WHEN raise_exception THEN
    NULL;  -- p keeps the defaults
  END;
  RETURN p;
END
$$;
