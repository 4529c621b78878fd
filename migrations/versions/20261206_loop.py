"""The loop runs itself: loop policy, triggers, cycles (issue 20).

A new schema `loop`: the per-route policy (loop.policy, every field defaulted), the global kill
switch and platform caps (loop.control), cycles with their state machine and transitions
(loop.cycle, loop.cycle_event), the trigger functions (volume, schedule, decline, drift, forget),
the limits and loop.start_due_cycles(), claiming and advancing cycles with leases, the canary and
watch verdicts, and loop.provenance(adapter). Triggers on train.training_run and
train.eval_request wake loop workers (NOTIFY cft_loop). The downgrade drops the schema (and with
it those triggers).

Revision ID: 20261206
Revises: 20261205
"""

from alembic import op

revision = "20261206"
down_revision = "20261205"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
-- The loop (issue 20): per-route policy, a global control row, cycles with a state machine.
-- Every policy field has a default here, and only here: `{"enabled": true}` turns a route's loop
-- on; PUT /v1/routes/{route}/loop writes the fields it names and resets the others to DEFAULT.
CREATE SCHEMA IF NOT EXISTS loop;

-- The global kill switch and the platform-wide caps: exactly one row.
CREATE TABLE loop.control (
  id                      boolean PRIMARY KEY DEFAULT true CHECK (id),
  paused                  boolean NOT NULL DEFAULT false,
  reason                  text,
  changed_by              text,
  changed_at              timestamptz NOT NULL DEFAULT now(),
  max_concurrent_training int NOT NULL DEFAULT 2 CHECK (max_concurrent_training >= 0)
);
INSERT INTO loop.control (id) VALUES (true);
COMMENT ON TABLE loop.control IS
  'One row: paused = true stops every loop cycle from starting (cft loop stop-all); '
  'max_concurrent_training caps the queued + running training runs of all tenants.';

CREATE TABLE loop.policy (
  route                   text PRIMARY KEY,
  tenant_id               int NOT NULL,
  enabled                 boolean NOT NULL DEFAULT false,
  paused                  boolean NOT NULL DEFAULT false,
  paused_reason           text,
  method                  text CHECK (method IN ('sft', 'dpo', 'kto', 'orpo', 'simpo')),
  min_new_examples        int NOT NULL DEFAULT 40 CHECK (min_new_examples >= 1),
  min_interval            interval NOT NULL DEFAULT '1 hour' CHECK (min_interval >= interval '0'),
  max_interval            interval CHECK (max_interval > interval '0'),
  decline_enabled         boolean NOT NULL DEFAULT true,
  decline_alpha           float8 NOT NULL DEFAULT 0.01 CHECK (decline_alpha > 0 AND decline_alpha < 0.5),
  decline_window          interval NOT NULL DEFAULT '1 day' CHECK (decline_window > interval '0'),
  decline_min_n           int NOT NULL DEFAULT 100 CHECK (decline_min_n >= 2),
  drift_enabled           boolean NOT NULL DEFAULT true,
  drift_distance          float8 NOT NULL DEFAULT 0.35 CHECK (drift_distance > 0 AND drift_distance <= 2),
  drift_share             float8 NOT NULL DEFAULT 0.3 CHECK (drift_share > 0 AND drift_share <= 1),
  drift_sample            int NOT NULL DEFAULT 200 CHECK (drift_sample BETWEEN 1 AND 10000),
  drift_min_n             int NOT NULL DEFAULT 50 CHECK (drift_min_n >= 1),
  max_cycles_per_day      int NOT NULL DEFAULT 4 CHECK (max_cycles_per_day >= 0),
  max_concurrent_training int NOT NULL DEFAULT 1 CHECK (max_concurrent_training >= 0),
  cooldown_after_reject   interval NOT NULL DEFAULT '6 hours' CHECK (cooldown_after_reject >= interval '0'),
  canary_pct              numeric(5,2) NOT NULL DEFAULT 10 CHECK (canary_pct > 0 AND canary_pct <= 100),
  canary_max_users        int NOT NULL DEFAULT 2000 CHECK (canary_max_users >= 1),
  canary_max_duration     interval NOT NULL DEFAULT '3 days' CHECK (canary_max_duration > interval '0'),
  decision_metric         text NOT NULL DEFAULT 'thumbs_up_rate'
                          CHECK (decision_metric IN ('feedback_mean', 'thumbs_up_rate', 'regen_rate', 'edit_rate')),
  decision_alpha          float8 NOT NULL DEFAULT 0.05 CHECK (decision_alpha > 0 AND decision_alpha < 0.5),
  decision_min_n          int NOT NULL DEFAULT 100 CHECK (decision_min_n >= 2),
  watch_window            interval NOT NULL DEFAULT '1 hour' CHECK (watch_window >= interval '0'),
  watch_alpha             float8 NOT NULL DEFAULT 0.01 CHECK (watch_alpha > 0 AND watch_alpha < 0.5),
  watch_min_n             int NOT NULL DEFAULT 50 CHECK (watch_min_n >= 2),
  eval_timeout            interval NOT NULL DEFAULT '2 hours' CHECK (eval_timeout > interval '0'),
  memory_tight            boolean NOT NULL DEFAULT false,
  hyperparameters         jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(hyperparameters) = 'object'),
  created_at              timestamptz NOT NULL DEFAULT now(),
  updated_at              timestamptz NOT NULL DEFAULT now(),
  updated_by              text,
  FOREIGN KEY (route, tenant_id) REFERENCES serve.route (name, tenant_id) ON DELETE CASCADE
);
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

-- The canary share may not exceed the route's ceiling (serve.route.max_canary_pct).
CREATE OR REPLACE FUNCTION loop.policy_check() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  v_max numeric;
BEGIN
  SELECT max_canary_pct INTO v_max FROM serve.route WHERE name = NEW.route;
  IF v_max IS NOT NULL AND NEW.canary_pct > v_max THEN
    RAISE check_violation USING CONSTRAINT = 'loop_policy_canary_ceiling',
      MESSAGE = format('canary_pct %s is above the ceiling of route %s (max_canary_pct %s)',
                       NEW.canary_pct, NEW.route, v_max);
  END IF;
  NEW.updated_at := now();
  RETURN NEW;
END
$$;
CREATE TRIGGER policy_check BEFORE INSERT OR UPDATE ON loop.policy
  FOR EACH ROW EXECUTE FUNCTION loop.policy_check();

-- The tenant of a route, for functions that run with owner rights: a caller scoped to a tenant
-- (the API's cft_app, cft.tenant_id set) may only ask about its own routes.
CREATE OR REPLACE FUNCTION loop.route_tenant(p_route text) RETURNS int
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  v_tenant int;
BEGIN
  SELECT tenant_id INTO v_tenant FROM serve.route WHERE name = p_route;
  IF NOT FOUND OR (auth.current_tenant_id() IS NOT NULL AND v_tenant <> auth.current_tenant_id()) THEN
    RAISE EXCEPTION 'route % not found', p_route USING ERRCODE = 'no_data_found';
  END IF;
  RETURN v_tenant;
END
$$;

-- The effective policy of a route: its row, or the column defaults when it has none (an insert
-- rolled back inside a subtransaction: the defaults stay defined once, in the table above).
CREATE OR REPLACE FUNCTION loop.effective_policy(p_route text) RETURNS loop.policy
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  p loop.policy;
  v_tenant int;
BEGIN
  v_tenant := loop.route_tenant(p_route);
  SELECT * INTO p FROM loop.policy WHERE route = p_route;
  IF FOUND THEN
    RETURN p;
  END IF;
  BEGIN
    INSERT INTO loop.policy (route, tenant_id) VALUES (p_route, v_tenant) RETURNING * INTO p;
    RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = 'loop.effective_policy: undo';
  EXCEPTION WHEN raise_exception THEN
    NULL;  -- p keeps the defaults
  END;
  RETURN p;
END
$$;

-- A cycle: one pass of the loop on one route, a row with a state machine
--   triggered -> snapshot -> training -> evaluating -> canary -> deciding -> watching
--     -> promoted | rejected | rolled_back | failed
-- driven by `cft worker loop` (workers/loop). A worker claims a cycle (FOR UPDATE SKIP LOCKED,
-- with a lease), runs one step of its state and releases it; a worker that dies holding it is
-- replaced after its lease (attempts + 1), and after max_attempts the cycle fails readably.
-- Each step stores what it made before the state moves on (snapshot_id, training_run_id,
-- adapter_id), so a resumed step finds its own work instead of doing it twice.
CREATE TABLE loop.cycle (
  id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant_id         int NOT NULL,
  route             text NOT NULL,
  state             text NOT NULL DEFAULT 'triggered'
                    CHECK (state IN ('triggered', 'snapshot', 'training', 'evaluating', 'canary',
                                     'deciding', 'watching', 'promoted', 'rejected',
                                     'rolled_back', 'failed')),
  trigger           text NOT NULL
                    CHECK (trigger IN ('volume', 'schedule', 'decline', 'drift', 'forget', 'manual')),
  trigger_values    jsonb NOT NULL DEFAULT '{}',   -- every trigger and limit when it started
  policy            jsonb NOT NULL DEFAULT '{}',   -- the policy it runs under (frozen at start)
  signal_counts     jsonb,                         -- what the method rule read
  method            text CHECK (method IN ('sft', 'dpo', 'kto', 'orpo', 'simpo')),
  method_reason     text,
  hyperparameters   jsonb,                         -- as enqueued (after scaling and overrides)
  snapshot_id       uuid,
  snapshot_counts   jsonb,
  n_train           int,
  n_eval            int,
  training_run_id   uuid,
  adapter_id        text,
  current_prod_id   text,                          -- the prod the candidate competes with
  eval_scores       jsonb,
  blockers          jsonb,
  canary_pct        numeric(5,2),
  canary_started_at timestamptz,
  experiment        jsonb,                         -- the numbers the decision read
  decision          text CHECK (decision IN ('promote', 'retire', 'reject', 'rollback', 'keep')),
  decision_code     text,
  decision_reason   text,
  previous_prod_id  text,
  promoted_at       timestamptz,
  watch_until       timestamptz,
  watch             jsonb,                         -- the guard numbers of the watch
  forget_request_id bigint,
  error             text,
  waiting_for       text,                          -- what the current step waits for
  worker_id         text,
  lease_until       timestamptz,
  attempts          int NOT NULL DEFAULT 0,
  max_attempts      int NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
  next_step_at      timestamptz NOT NULL DEFAULT now(),  -- a waiting step is retried from then
  state_entered_at  timestamptz NOT NULL DEFAULT now(),
  created_at        timestamptz NOT NULL DEFAULT now(),
  updated_at        timestamptz NOT NULL DEFAULT now(),
  finished_at       timestamptz,
  FOREIGN KEY (route, tenant_id) REFERENCES serve.route (name, tenant_id) ON DELETE CASCADE
);
-- At most one cycle in flight per route (watching included: a new cycle waits for the watch).
CREATE UNIQUE INDEX cycle_one_active_per_route ON loop.cycle (route)
  WHERE state NOT IN ('promoted', 'rejected', 'rolled_back', 'failed');
CREATE INDEX cycle_route_created_idx ON loop.cycle (route, created_at);
CREATE INDEX cycle_adapter_idx ON loop.cycle (adapter_id) WHERE adapter_id IS NOT NULL;
CREATE INDEX cycle_runnable_idx ON loop.cycle (next_step_at)
  WHERE state NOT IN ('promoted', 'rejected', 'rolled_back', 'failed');
COMMENT ON TABLE loop.cycle IS
  'One pass of the loop on a route: trigger, method, snapshot, run, adapter, evals, canary, '
  'decision, watch; state moves triggered -> ... -> promoted | rejected | rolled_back | failed.';

-- Every transition with what it was decided on.
CREATE TABLE loop.cycle_event (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  cycle_id    bigint NOT NULL REFERENCES loop.cycle(id) ON DELETE CASCADE,
  tenant_id   int NOT NULL,
  from_state  text,
  to_state    text NOT NULL,
  worker_id   text,
  inputs      jsonb NOT NULL DEFAULT '{}',
  note        text,
  at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX cycle_event_cycle_idx ON loop.cycle_event (cycle_id, id);

-- Wake loop workers (LISTEN cft_loop): a cycle started, a training run or an eval request ended.
CREATE OR REPLACE FUNCTION loop.notify() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public AS $$
BEGIN
  PERFORM pg_notify('cft_loop', TG_TABLE_NAME);
  RETURN NULL;
END
$$;
CREATE TRIGGER cycle_notify AFTER INSERT ON loop.cycle
  FOR EACH ROW EXECUTE FUNCTION loop.notify();
CREATE TRIGGER loop_training_run_notify AFTER UPDATE OF status ON train.training_run
  FOR EACH ROW WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled') AND OLD.status <> NEW.status)
  EXECUTE FUNCTION loop.notify();
CREATE TRIGGER loop_eval_request_notify AFTER UPDATE OF status ON train.eval_request
  FOR EACH ROW WHEN (NEW.status IN ('done', 'failed') AND OLD.status <> NEW.status)
  EXECUTE FUNCTION loop.notify();

-- Triggers of the loop: SQL functions the worker only calls. Each returns one row: whether it
-- fired, its current value and threshold, the numbers behind it (detail) and a line for people
-- ("waiting: 14 of 40 usable regenerate pairs"). Owner rights (the candidate views have no
-- row-level security), limited to the caller's tenant by loop.route_tenant.

-- A one-sided two-proportion z-test (pooled standard error): the p-value of "rate 2 > rate 1".
CREATE OR REPLACE FUNCTION loop.prop_test(x1 bigint, n1 bigint, x2 bigint, n2 bigint)
RETURNS TABLE (rate1 float8, rate2 float8, z float8, p_value float8)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  se float8;
BEGIN
  IF coalesce(n1, 0) <= 0 OR coalesce(n2, 0) <= 0 THEN
    RETURN QUERY SELECT NULL::float8, NULL::float8, NULL::float8, NULL::float8;
    RETURN;
  END IF;
  rate1 := x1::float8 / n1;
  rate2 := x2::float8 / n2;
  se := sqrt(((x1 + x2)::float8 / (n1 + n2)) * (1 - (x1 + x2)::float8 / (n1 + n2))
             * (1.0 / n1 + 1.0 / n2));
  IF se > 0 THEN
    z := (rate2 - rate1) / se;
    p_value := 1 - stats.norm_cdf(z);
  END IF;
  RETURN NEXT;
END
$$;

-- Usable examples of each signal of a route created since p_since (and within the snapshots'
-- default 60-day window): the candidate views (consent and pii_flags = 0 at their refresh), the
-- tenant's consent now, minus rows deleted or flagged since the refresh (obs.deleted_log, as
-- train.create_snapshot skips them), exact dedup by prompt hash (train.prompt_hash, the
-- snapshot's first dedup step). Semantic dedup is not applied: the count can exceed what a
-- snapshot keeps by the near-duplicates it drops. The views are as fresh as their last refresh
-- (`cft worker loop` refreshes them every --refresh seconds; a snapshot refreshes its own).
CREATE OR REPLACE FUNCTION loop.signal_counts(p_route text, p_since timestamptz DEFAULT NULL)
RETURNS TABLE (edits bigint, regen_pairs bigint, pairs bigint, thumbs bigint, since timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  v_tenant int := loop.route_tenant(p_route);
  v_since  timestamptz := greatest(coalesce(p_since, '-infinity'), now() - interval '60 days');
BEGIN
  IF NOT coalesce((SELECT t.consent_training FROM tenant t WHERE t.id = v_tenant), false) THEN
    RETURN QUERY SELECT 0::bigint, 0::bigint, 0::bigint, 0::bigint, v_since;
    RETURN;
  END IF;
  RETURN QUERY
  WITH dead AS MATERIALIZED (
    SELECT d.log_id, d.created_at FROM obs.deleted_log d
     WHERE NOT EXISTS (SELECT 1 FROM obs.inference_log x
                        WHERE x.id = d.log_id AND x.created_at = d.created_at AND x.pii_flags = 0)
  ), pair AS (
    SELECT c.source, train.prompt_hash(c.example->'prompt') AS h
      FROM train.pair_candidate c
     WHERE c.tenant_id = v_tenant AND c.route = p_route AND c.created_at >= v_since
       AND (c.prompt_log_id, c.prompt_created_at) NOT IN (SELECT * FROM dead)
       AND (c.chosen_log_id, c.chosen_created_at) NOT IN (SELECT * FROM dead)
  )
  SELECT
    (SELECT count(DISTINCT train.prompt_hash((c.example->'messages') - (-1)))
       FROM train.sft_candidate c
      WHERE c.tenant_id = v_tenant AND c.route = p_route AND c.created_at >= v_since
        AND (c.prompt_log_id, c.prompt_created_at) NOT IN (SELECT * FROM dead)),
    (SELECT count(DISTINCT h) FROM pair WHERE source = 'regen'),
    (SELECT count(DISTINCT h) FROM pair),
    (SELECT count(DISTINCT train.prompt_hash(c.example->'prompt'))
       FROM train.kto_candidate c
      WHERE c.tenant_id = v_tenant AND c.route = p_route AND c.created_at >= v_since
        AND (c.prompt_log_id, c.prompt_created_at) NOT IN (SELECT * FROM dead)),
    v_since;
END
$$;

CREATE OR REPLACE FUNCTION loop.last_cycle_at(p_route text) RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
  SELECT max(created_at) FROM loop.cycle WHERE route = p_route
$$;

-- Volume: usable examples of one signal since the route's last cycle >= min_new_examples. With
-- a pinned method, the signal that method trains on; otherwise the largest of edits, regenerate
-- pairs and thumbs.
CREATE OR REPLACE FUNCTION loop.trigger_volume(p_route text)
RETURNS TABLE (trigger text, fired boolean, value float8, threshold float8, detail jsonb, line text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  p      loop.policy := loop.effective_policy(p_route);
  v_last timestamptz := loop.last_cycle_at(p_route);
  s      record;
  v_sig  text;
  v_n    bigint;
BEGIN
  SELECT * INTO s FROM loop.signal_counts(p_route, v_last);
  IF p.method = 'sft' THEN
    v_sig := 'edits'; v_n := s.edits;
  ELSIF p.method IN ('dpo', 'orpo', 'simpo') THEN
    v_sig := 'preference pairs'; v_n := s.pairs;
  ELSIF p.method = 'kto' THEN
    v_sig := 'thumbs'; v_n := s.thumbs;
  ELSE
    SELECT x.sig, x.n INTO v_sig, v_n
      FROM (VALUES ('edits', s.edits, 1), ('regenerate pairs', s.regen_pairs, 2),
                   ('thumbs', s.thumbs, 3)) x(sig, n, o)
     ORDER BY x.n DESC, x.o LIMIT 1;
  END IF;
  RETURN QUERY SELECT 'volume'::text, v_n >= p.min_new_examples, v_n::float8,
    p.min_new_examples::float8,
    jsonb_build_object('signal', v_sig, 'edits', s.edits, 'regen_pairs', s.regen_pairs,
                       'pairs', s.pairs, 'thumbs', s.thumbs, 'since', s.since,
                       'last_cycle_at', v_last, 'dedup', 'exact (prompt hash)'),
    format('%s: %s of %s usable %s since %s',
           CASE WHEN v_n >= p.min_new_examples THEN 'fired' ELSE 'waiting' END,
           v_n, p.min_new_examples, v_sig,
           CASE WHEN v_last IS NULL THEN 'ever (60-day window)' ELSE 'the last cycle' END);
END
$$;

-- Schedule: a cycle at least every max_interval (from the last cycle, or from when the policy
-- was written). min_interval is a limit (loop.limits), not a trigger.
CREATE OR REPLACE FUNCTION loop.trigger_schedule(p_route text)
RETURNS TABLE (trigger text, fired boolean, value float8, threshold float8, detail jsonb, line text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  p     loop.policy := loop.effective_policy(p_route);
  v_ref timestamptz := coalesce(loop.last_cycle_at(p_route), p.created_at);
  v_age float8 := extract(epoch FROM now() - v_ref);
  v_max float8 := extract(epoch FROM p.max_interval);
BEGIN
  RETURN QUERY SELECT 'schedule'::text, coalesce(v_age >= v_max, false), v_age, v_max,
    jsonb_build_object('since', v_ref, 'max_interval', p.max_interval, 'min_interval', p.min_interval),
    CASE WHEN p.max_interval IS NULL THEN 'off: no max_interval'
         WHEN v_age >= v_max THEN format('fired: %s since the last cycle (at least every %s)',
                                         date_trunc('second', now() - v_ref), p.max_interval)
         ELSE format('waiting: %s of %s since the last cycle', date_trunc('second', now() - v_ref),
                     p.max_interval) END;
END
$$;

-- Decline: the prod adapter's thumbs-up rate (of rated rows) over the last decline_window is
-- lower than over the first decline_window after its promotion, by a one-sided two-proportion
-- z-test at decline_alpha, with at least decline_min_n rated rows in each window (the windows
-- may not overlap).
CREATE OR REPLACE FUNCTION loop.trigger_decline(p_route text)
RETURNS TABLE (trigger text, fired boolean, value float8, threshold float8, detail jsonb, line text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  p      loop.policy := loop.effective_policy(p_route);
  v_prod serve.adapter%ROWTYPE;
  v_t0   timestamptz;
  b      record;
  l      record;
  t      record;
  v_d    jsonb;
BEGIN
  SELECT * INTO v_prod FROM serve.adapter a WHERE a.route = p_route AND a.status = 'prod';
  IF NOT p.decline_enabled OR v_prod.id IS NULL THEN
    RETURN QUERY SELECT 'decline'::text, false, NULL::float8, p.decline_alpha,
      jsonb_build_object('prod', v_prod.id),
      CASE WHEN NOT p.decline_enabled THEN 'off' ELSE 'no prod adapter to watch' END;
    RETURN;
  END IF;
  v_t0 := coalesce(v_prod.promoted_at, v_prod.created_at);
  SELECT count(*) AS n, count(*) FILTER (WHERE fb_explicit > 0) AS x INTO b
    FROM obs.inference_log WHERE tenant_id = v_prod.tenant_id AND adapter_id = v_prod.id
     AND created_at >= v_t0 AND created_at < v_t0 + p.decline_window AND fb_explicit <> 0;
  SELECT count(*) AS n, count(*) FILTER (WHERE fb_explicit > 0) AS x INTO l
    FROM obs.inference_log WHERE tenant_id = v_prod.tenant_id AND adapter_id = v_prod.id
     AND created_at >= greatest(now() - p.decline_window, v_t0 + p.decline_window)
     AND fb_explicit <> 0;
  -- p_value of "baseline rate > live rate"
  SELECT * INTO t FROM loop.prop_test(l.x, l.n, b.x, b.n);
  v_d := jsonb_build_object('prod', v_prod.id, 'since_promotion', v_t0,
    'baseline', jsonb_build_object('n', b.n, 'thumbs_up', b.x, 'rate', t.rate2),
    'live', jsonb_build_object('n', l.n, 'thumbs_up', l.x, 'rate', t.rate1),
    'z', t.z, 'p_value', t.p_value, 'alpha', p.decline_alpha, 'min_n', p.decline_min_n,
    'test', 'one-sided two-proportion z (pooled)');
  IF now() < v_t0 + 2 * p.decline_window THEN
    RETURN QUERY SELECT 'decline'::text, false, t.rate1, t.rate2, v_d,
      format('waiting: prod %s has served %s of the %s needed for two windows', v_prod.id,
             date_trunc('second', now() - v_t0), 2 * p.decline_window);
  ELSIF b.n < p.decline_min_n OR l.n < p.decline_min_n THEN
    RETURN QUERY SELECT 'decline'::text, false, t.rate1, t.rate2, v_d,
      format('waiting: %s and %s rated rows (after promotion, now), %s each needed', b.n, l.n,
             p.decline_min_n);
  ELSE
    RETURN QUERY SELECT 'decline'::text, coalesce(t.p_value < p.decline_alpha, false), t.rate1,
      t.rate2, v_d,
      format('%s: thumbs-up %s now vs %s after promotion (p = %s, alpha %s)',
             CASE WHEN t.p_value < p.decline_alpha THEN 'fired' ELSE 'steady' END,
             round(t.rate1::numeric, 3), round(t.rate2::numeric, 3),
             round(t.p_value::numeric, 4), p.decline_alpha);
  END IF;
END
$$;

-- Drift: of the route's last drift_sample embedded prompts logged after the prod adapter's
-- training snapshot was taken, the share whose nearest training prompt (cosine distance to the
-- embeddings of the snapshot's source log rows, train.dataset_example.log_ids) is farther than
-- drift_distance. Fires when that share >= drift_share over at least drift_min_n prompts.
-- Exact nearest neighbours (a scan of the snapshot's prompts per recent prompt): drift_sample x
-- training rows distances, ~1 s at 200 x 10k.
CREATE OR REPLACE FUNCTION loop.trigger_drift(p_route text)
RETURNS TABLE (trigger text, fired boolean, value float8, threshold float8, detail jsonb, line text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  p      loop.policy := loop.effective_policy(p_route);
  v_prod serve.adapter%ROWTYPE;
  v_snap train.dataset_snapshot%ROWTYPE;
  r      record;
  v_d    jsonb;
BEGIN
  SELECT * INTO v_prod FROM serve.adapter a WHERE a.route = p_route AND a.status = 'prod';
  SELECT * INTO v_snap FROM train.dataset_snapshot s WHERE s.id = v_prod.dataset_snapshot_id;
  IF NOT p.drift_enabled OR v_snap.id IS NULL THEN
    RETURN QUERY SELECT 'drift'::text, false, NULL::float8, p.drift_share,
      jsonb_build_object('prod', v_prod.id),
      CASE WHEN NOT p.drift_enabled THEN 'off'
           WHEN v_prod.id IS NULL THEN 'no prod adapter to compare with'
           ELSE format('prod %s has no training snapshot to compare with', v_prod.id) END;
    RETURN;
  END IF;
  WITH train_rows AS MATERIALIZED (
    SELECT l.embedding FROM obs.inference_log l
     WHERE l.tenant_id = v_prod.tenant_id AND l.embedding IS NOT NULL
       AND l.id IN (SELECT unnest(e.log_ids) FROM train.dataset_example e
                     WHERE e.snapshot_id = v_snap.id)
  ), recent AS (
    SELECT l.embedding FROM obs.inference_log l
     WHERE l.tenant_id = v_prod.tenant_id AND l.route = p_route AND l.created_at > v_snap.created_at
       AND l.embedding IS NOT NULL
     ORDER BY l.created_at DESC LIMIT p.drift_sample
  ), d AS (
    SELECT (SELECT min(r2.embedding <=> t.embedding) FROM train_rows t) AS dist FROM recent r2
  )
  SELECT (SELECT count(*) FROM train_rows) AS n_train, count(*) AS n,
         count(*) FILTER (WHERE d.dist > p.drift_distance) AS far, avg(d.dist) AS mean_dist
    INTO r FROM d;
  v_d := jsonb_build_object('prod', v_prod.id, 'snapshot_id', v_snap.id,
    'training_prompts', r.n_train, 'recent_prompts', r.n, 'far', r.far,
    'mean_nearest_distance', r.mean_dist, 'distance', p.drift_distance,
    'sample', p.drift_sample, 'min_n', p.drift_min_n);
  IF r.n_train = 0 THEN
    RETURN QUERY SELECT 'drift'::text, false, NULL::float8, p.drift_share, v_d,
      format('no embedded training prompt in snapshot %s', v_snap.id);
  ELSIF r.n < p.drift_min_n THEN
    RETURN QUERY SELECT 'drift'::text, false, (r.far::float8 / nullif(r.n, 0)), p.drift_share, v_d,
      format('waiting: %s of %s embedded prompts since the prod''s snapshot', r.n, p.drift_min_n);
  ELSE
    RETURN QUERY SELECT 'drift'::text, r.far::float8 / r.n >= p.drift_share,
      r.far::float8 / r.n, p.drift_share, v_d,
      format('%s: %s of %s recent prompts (%s %%) are farther than %s from every training prompt'
             ' (fires at %s %%)',
             CASE WHEN r.far::float8 / r.n >= p.drift_share THEN 'fired' ELSE 'steady' END,
             r.far, r.n, round(100.0 * r.far / r.n, 1), p.drift_distance,
             round((100 * p.drift_share)::numeric, 1));
  END IF;
END
$$;

-- Forget: the prod adapter is tainted (a user it was trained on was forgotten).
CREATE OR REPLACE FUNCTION loop.trigger_forget(p_route text)
RETURNS TABLE (trigger text, fired boolean, value float8, threshold float8, detail jsonb, line text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  v_prod serve.adapter%ROWTYPE;
BEGIN
  PERFORM loop.route_tenant(p_route);
  SELECT * INTO v_prod FROM serve.adapter a WHERE a.route = p_route AND a.status = 'prod';
  RETURN QUERY SELECT 'forget'::text, v_prod.tainted_at IS NOT NULL,
    CASE WHEN v_prod.tainted_at IS NOT NULL THEN 1 ELSE 0 END::float8, 1::float8,
    jsonb_build_object('prod', v_prod.id, 'tainted_at', v_prod.tainted_at,
                       'tainted_reason', v_prod.tainted_reason,
                       'forget_request_id',
                       (substring(v_prod.tainted_reason FROM 'forget request (\d+)'))::bigint),
    CASE WHEN v_prod.id IS NULL THEN 'no prod adapter'
         WHEN v_prod.tainted_at IS NOT NULL
           THEN format('fired: prod %s is tainted (%s)', v_prod.id, v_prod.tainted_reason)
         ELSE format('clean: prod %s is not tainted', v_prod.id) END;
END
$$;

-- Every trigger of a route, in the order a cycle start picks them (the first that fired).
CREATE OR REPLACE FUNCTION loop.triggers(p_route text)
RETURNS TABLE (trigger text, fired boolean, value float8, threshold float8, detail jsonb, line text)
LANGUAGE sql VOLATILE AS $$
  SELECT * FROM loop.trigger_forget(p_route)
  UNION ALL SELECT * FROM loop.trigger_decline(p_route)
  UNION ALL SELECT * FROM loop.trigger_drift(p_route)
  UNION ALL SELECT * FROM loop.trigger_volume(p_route)
  UNION ALL SELECT * FROM loop.trigger_schedule(p_route)
$$;
COMMENT ON FUNCTION loop.triggers(text) IS
  'The live value of every loop trigger of a route (forget, decline, drift, volume, schedule).';

-- Limits of the loop: what holds a triggered cycle back. One row per limit with blocking = true
-- when it holds now; a forget cycle (the prod must be replaced) is not held by min_interval or
-- the cool-down (forget_bypasses), only by the switches, the one-cycle rule, max cycles per day
-- (so a replacement the gate keeps refusing does not retrain without end) and the capacity.
CREATE OR REPLACE FUNCTION loop.limits(p_route text)
RETURNS TABLE (limit_name text, blocking boolean, value float8, threshold float8,
               forget_bypasses boolean, line text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  p        loop.policy := loop.effective_policy(p_route);
  k        loop.control;
  v_active bigint;
  v_day    bigint;
  v_last   timestamptz := loop.last_cycle_at(p_route);
  v_reject timestamptz;
  v_tenant bigint;
  v_all    bigint;
BEGIN
  SELECT * INTO k FROM loop.control;
  SELECT id INTO v_active FROM loop.cycle
   WHERE route = p_route AND state NOT IN ('promoted', 'rejected', 'rolled_back', 'failed');
  SELECT count(*) INTO v_day FROM loop.cycle
   WHERE route = p_route AND created_at > now() - interval '1 day';
  SELECT max(finished_at) INTO v_reject FROM loop.cycle
   WHERE route = p_route AND state IN ('rejected', 'rolled_back');
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
COMMENT ON FUNCTION loop.limits(text) IS
  'What holds a new loop cycle of the route back now (blocking = true): switches, one cycle at a '
  'time, max cycles per day, min_interval, cool-down after a rejection, training capacity.';

-- Start the cycles that are due: for every enabled, unpaused route (rows locked, SKIP LOCKED:
-- concurrent callers split the routes), the first trigger that fired, unless a limit holds.
-- Returns the cycles started. Nothing starts while loop.control.paused.
CREATE OR REPLACE FUNCTION loop.start_due_cycles() RETURNS SETOF loop.cycle
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
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
  FOR v_route IN SELECT q.route FROM "loop".policy q WHERE q.enabled AND NOT q.paused
                  ORDER BY q.route FOR UPDATE SKIP LOCKED LOOP
    SELECT jsonb_agg(to_jsonb(t)) INTO v_trig FROM loop.triggers(v_route) t;
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
      INTO v_lims, v_block FROM loop.limits(v_route) l;
    CONTINUE WHEN v_block IS NOT NULL;
    p := loop.effective_policy(v_route);
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

-- Driving cycles: claim one (SKIP LOCKED + lease), move it on (advance: a new state and what the
-- step produced, recorded in loop.cycle_event), let it wait (same state, checked again later),
-- or count a failed step. A claimed cycle whose worker stopped (lease expired) is resumed by the
-- next claim in its stored state, attempts + 1; at max_attempts it fails with the reason.

CREATE OR REPLACE FUNCTION loop.claim_cycle(p_worker text, p_lease interval)
RETURNS SETOF loop.cycle LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, public AS $$
DECLARE
  v loop.cycle;
  v_err text;
BEGIN
  FOR v IN SELECT * FROM "loop".cycle  -- quoted: PL/pgSQL ends a FOR's query at LOOP
            WHERE state NOT IN ('promoted', 'rejected', 'rolled_back', 'failed')
              AND worker_id IS NOT NULL AND lease_until < now() AND attempts + 1 >= max_attempts
            FOR UPDATE SKIP LOCKED LOOP
    v_err := format('worker %s stopped in state %s (lease expired at %s); gave up after %s attempts',
                    v.worker_id, v.state, v.lease_until, v.attempts + 1);
    UPDATE loop.cycle SET state = 'failed', error = v_err, attempts = attempts + 1,
           worker_id = NULL, lease_until = NULL, finished_at = now(), updated_at = now(),
           state_entered_at = now(), waiting_for = NULL
     WHERE id = v.id;
    INSERT INTO loop.cycle_event (cycle_id, tenant_id, from_state, to_state, worker_id, note)
    VALUES (v.id, v.tenant_id, v.state, 'failed', v.worker_id, v_err);
  END LOOP;

  SELECT * INTO v FROM loop.cycle q
   WHERE q.state NOT IN ('promoted', 'rejected', 'rolled_back', 'failed')
     AND q.next_step_at <= now() AND (q.worker_id IS NULL OR q.lease_until < now())
   ORDER BY q.next_step_at, q.id LIMIT 1 FOR UPDATE SKIP LOCKED;
  IF v.id IS NULL THEN
    RETURN;
  END IF;
  IF v.worker_id IS NOT NULL THEN
    v_err := format('attempt %s: worker %s stopped in state %s (lease expired at %s); resumed by %s',
                    v.attempts + 1, v.worker_id, v.state, v.lease_until, p_worker);
    INSERT INTO loop.cycle_event (cycle_id, tenant_id, from_state, to_state, worker_id, note)
    VALUES (v.id, v.tenant_id, v.state, v.state, p_worker, v_err);
  END IF;
  RETURN QUERY
  UPDATE loop.cycle c
     SET worker_id = p_worker, lease_until = now() + p_lease,
         attempts = c.attempts + CASE WHEN c.worker_id IS NOT NULL THEN 1 ELSE 0 END,
         error = coalesce(v_err, c.error), updated_at = now()
   WHERE c.id = v.id
  RETURNING c.*;
END
$$;

-- Renew the lease of a cycle this worker holds; false: it is not ours any more.
CREATE OR REPLACE FUNCTION loop.heartbeat_cycle(p_id bigint, p_worker text, p_lease interval)
RETURNS boolean LANGUAGE sql VOLATILE AS $$
  WITH u AS (UPDATE loop.cycle SET lease_until = now() + p_lease
              WHERE id = p_id AND worker_id = p_worker RETURNING 1)
  SELECT EXISTS (SELECT 1 FROM u)
$$;

-- Move a cycle this worker holds to p_to, storing p_set (columns of loop.cycle by name) and
-- recording the transition with p_inputs; releases it for the next step. Raises
-- object_not_in_prerequisite_state when the cycle is not this worker's any more.
CREATE OR REPLACE FUNCTION loop.advance_cycle(p_id bigint, p_worker text, p_to text,
                                              p_set jsonb DEFAULT '{}', p_inputs jsonb DEFAULT '{}',
                                              p_note text DEFAULT NULL)
RETURNS loop.cycle LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, public AS $$
DECLARE
  v_from text;
  c      loop.cycle;
BEGIN
  SELECT state INTO v_from FROM loop.cycle WHERE id = p_id AND worker_id = p_worker FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'loop cycle % is not held by worker %', p_id, p_worker
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  UPDATE loop.cycle c0
     SET (signal_counts, method, method_reason, hyperparameters, snapshot_id, snapshot_counts,
          n_train, n_eval, training_run_id, adapter_id, current_prod_id, eval_scores, blockers,
          canary_pct, canary_started_at, experiment, decision, decision_code, decision_reason,
          previous_prod_id, promoted_at, watch_until, watch, error)
       = (SELECT r.signal_counts, r.method, r.method_reason, r.hyperparameters, r.snapshot_id,
                 r.snapshot_counts, r.n_train, r.n_eval, r.training_run_id, r.adapter_id,
                 r.current_prod_id, r.eval_scores, r.blockers, r.canary_pct, r.canary_started_at,
                 r.experiment, r.decision, r.decision_code, r.decision_reason, r.previous_prod_id,
                 r.promoted_at, r.watch_until, r.watch, r.error
            FROM jsonb_populate_record(c0, p_set) r),
         state = p_to,
         state_entered_at = CASE WHEN p_to <> v_from THEN now() ELSE c0.state_entered_at END,
         finished_at = CASE WHEN p_to IN ('promoted', 'rejected', 'rolled_back', 'failed')
                            THEN now() END,
         worker_id = NULL, lease_until = NULL, next_step_at = now(), waiting_for = NULL,
         updated_at = now()
   WHERE c0.id = p_id
  RETURNING * INTO c;
  INSERT INTO loop.cycle_event (cycle_id, tenant_id, from_state, to_state, worker_id, inputs, note)
  VALUES (p_id, c.tenant_id, v_from, p_to, p_worker, coalesce(p_inputs, '{}'), p_note);
  RETURN c;
END
$$;

-- The step cannot finish yet (training, evaluating, collecting canary traffic): store p_set,
-- say what it waits for, and check again after p_delay. No event (waiting_for shows it).
CREATE OR REPLACE FUNCTION loop.wait_cycle(p_id bigint, p_worker text, p_delay interval,
                                           p_waiting_for text, p_set jsonb DEFAULT '{}')
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, public AS $$
BEGIN
  UPDATE loop.cycle c0
     SET (experiment, watch, training_run_id, eval_scores)
       = (SELECT r.experiment, r.watch, r.training_run_id, r.eval_scores
            FROM jsonb_populate_record(c0, p_set) r),
         waiting_for = p_waiting_for, next_step_at = now() + p_delay,
         worker_id = NULL, lease_until = NULL, updated_at = now()
   WHERE c0.id = p_id AND c0.worker_id = p_worker;
  RETURN FOUND;
END
$$;

-- A step raised: count the attempt; retry after a pause, or fail the cycle at max_attempts.
-- Returns the state the cycle is in afterwards (NULL: not this worker's).
CREATE OR REPLACE FUNCTION loop.fail_step(p_id bigint, p_worker text, p_error text,
                                          p_final boolean DEFAULT false)
RETURNS text LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, public AS $$
DECLARE
  v loop.cycle;
BEGIN
  SELECT * INTO v FROM loop.cycle WHERE id = p_id AND worker_id = p_worker FOR UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF p_final OR v.attempts + 1 >= v.max_attempts THEN
    UPDATE loop.cycle SET state = 'failed', attempts = attempts + 1,
           error = format('%s failed: %s', v.state, p_error) ||
                   CASE WHEN p_final THEN '' ELSE format(' (after %s attempts)', v.attempts + 1) END,
           worker_id = NULL, lease_until = NULL, finished_at = now(), state_entered_at = now(),
           waiting_for = NULL, updated_at = now()
     WHERE id = p_id;
    INSERT INTO loop.cycle_event (cycle_id, tenant_id, from_state, to_state, worker_id, note)
    VALUES (p_id, v.tenant_id, v.state, 'failed', p_worker, p_error);
    RETURN 'failed';
  END IF;
  UPDATE loop.cycle SET attempts = attempts + 1,
         error = format('attempt %s in state %s: %s', v.attempts + 1, v.state, p_error),
         worker_id = NULL, lease_until = NULL,
         next_step_at = now() + least(interval '5 minutes', (v.attempts + 1) * interval '5 seconds'),
         updated_at = now()
   WHERE id = p_id;
  INSERT INTO loop.cycle_event (cycle_id, tenant_id, from_state, to_state, worker_id, note)
  VALUES (p_id, v.tenant_id, v.state, v.state, p_worker, 'step failed, will retry: ' || p_error);
  RETURN v.state;
END
$$;

-- What the loop decides on live traffic. app/loop/decision.py is the only caller, so the rule
-- can be swapped in one place (for the always-valid sequential decision of issue 21).

-- The canary of a cycle against the route's prod, on obs.experiment_compare's fixed-horizon
-- numbers since the canary opened (decision_metric at decision_alpha, regen_rate as guard):
--   promote  - significantly better on the metric, guard not significantly worse;
--   retire   - significantly worse on the metric, or on the guard;
--   continue - not yet (too few rows per arm, or no significant difference);
-- when the canary's budget (canary_max_users distinct users or canary_max_duration) runs out
-- without a significant result, the offline gate's verdict stands: promote when not
-- significantly worse (non-inferior), retire when no comparable traffic was seen.
CREATE OR REPLACE FUNCTION loop.canary_verdict(p_cycle bigint)
RETURNS TABLE (decision text, code text, reason text, numbers jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  c       loop.cycle;
  p       loop.policy;
  v_exp   text;
  v_prod  text;
  m       jsonb;
  g       jsonb;
  v_users bigint;
  v_age   interval;
  v_out   boolean;
  v_num   jsonb;
  v_line  text;
BEGIN
  SELECT * INTO c FROM loop.cycle WHERE id = p_cycle;
  p := loop.effective_policy(c.route);
  SELECT coalesce(r.experiment, r.name) INTO v_exp FROM serve.route r WHERE r.name = c.route;
  v_prod := serve.current_prod(c.route);
  SELECT to_jsonb(x) INTO m FROM obs.experiment_compare(v_exp, c.canary_started_at, now(), p.decision_alpha) x
   WHERE x.canary_adapter = c.adapter_id AND x.metric = p.decision_metric
   ORDER BY x.n_canary DESC LIMIT 1;
  SELECT to_jsonb(x) INTO g FROM obs.experiment_compare(v_exp, c.canary_started_at, now(), p.decision_alpha) x
   WHERE x.canary_adapter = c.adapter_id AND x.metric = 'regen_rate'
   ORDER BY x.n_canary DESC LIMIT 1;
  SELECT count(DISTINCT l.user_hash) INTO v_users FROM obs.inference_log l
   WHERE l.tenant_id = c.tenant_id AND l.adapter_id = c.adapter_id AND l.created_at >= c.canary_started_at;
  v_age := now() - c.canary_started_at;
  v_out := v_users >= p.canary_max_users OR v_age >= p.canary_max_duration;
  v_num := jsonb_build_object('experiment', v_exp, 'metric', m, 'guard_regen_rate', g,
    'prod', v_prod, 'canary_users', v_users, 'canary_age_s', extract(epoch FROM v_age),
    'budget', jsonb_build_object('max_users', p.canary_max_users, 'max_duration', p.canary_max_duration,
                                 'exhausted', v_out),
    'rule', 'obs.experiment_compare (fixed horizon) via loop.canary_verdict',
    'alpha', p.decision_alpha, 'min_n', p.decision_min_n, 'until', now());
  IF m IS NOT NULL THEN
    v_line := format('%s: prod %s, canary %s, diff %s [%s, %s], p = %s, n %s vs %s',
      p.decision_metric, round((m->>'control_value')::numeric, 4), round((m->>'canary_value')::numeric, 4),
      round((m->>'diff')::numeric, 4), round((m->>'diff_ci_low')::numeric, 4),
      round((m->>'diff_ci_high')::numeric, 4), round((m->>'p_value')::numeric, 4),
      m->>'n_control', m->>'n_canary');
  END IF;

  IF m IS NULL OR (v_prod IS NOT NULL AND m->>'control_adapter' IS DISTINCT FROM v_prod) THEN
    RETURN QUERY SELECT CASE WHEN v_out THEN 'retire' ELSE 'continue' END,
      CASE WHEN v_out THEN 'budget_no_data' ELSE 'no_data' END,
      format('no comparable traffic of canary %s and prod %s yet (%s users, %s)%s', c.adapter_id,
             coalesce(v_prod, 'none'), v_users, date_trunc('second', v_age),
             CASE WHEN v_out THEN ': budget exhausted' ELSE '' END), v_num;
  ELSIF (m->>'significant')::boolean AND (m->>'canary_better')::boolean IS FALSE THEN
    RETURN QUERY SELECT 'retire', 'worse', 'canary significantly worse: ' || v_line, v_num;
  ELSIF coalesce((g->>'significant')::boolean, false) AND (g->>'canary_better')::boolean IS FALSE
        AND p.decision_metric <> 'regen_rate' THEN
    RETURN QUERY SELECT 'retire', 'guard_regen',
      format('regenerations significantly higher (%s -> %s, p = %s); ',
             round((g->>'control_value')::numeric, 4), round((g->>'canary_value')::numeric, 4),
             round((g->>'p_value')::numeric, 4)) || v_line, v_num;
  ELSIF least((m->>'n_control')::bigint, (m->>'n_canary')::bigint) < p.decision_min_n THEN
    RETURN QUERY SELECT CASE WHEN v_out THEN 'promote' ELSE 'continue' END,
      CASE WHEN v_out THEN 'budget_non_inferior' ELSE 'insufficient_sample' END,
      CASE WHEN v_out THEN 'budget exhausted, not significantly worse: '
           ELSE format('waiting for %s rows per arm: ', p.decision_min_n) END || v_line, v_num;
  ELSIF (m->>'significant')::boolean AND (m->>'canary_better')::boolean THEN
    RETURN QUERY SELECT 'promote', 'better', 'canary significantly better: ' || v_line, v_num;
  ELSIF v_out THEN
    RETURN QUERY SELECT 'promote', 'budget_non_inferior',
      'budget exhausted, not significantly worse: ' || v_line, v_num;
  ELSE
    RETURN QUERY SELECT 'continue', 'not_significant', 'no significant difference yet: ' || v_line, v_num;
  END IF;
END
$$;

-- The watch after a promotion: the new prod's guard rates since its promotion against the
-- previous prod's over the day (or watch_window, if longer) before it, each by a one-sided
-- two-proportion z-test at watch_alpha with watch_min_n rows a side. Guards: regenerate rate
-- (of all rows) and thumbs-down rate (of rated rows). regressed = some guard is significantly
-- worse; done = the window is over.
CREATE OR REPLACE FUNCTION loop.watch_verdict(p_cycle bigint)
RETURNS TABLE (regressed boolean, done boolean, metric text, reason text, numbers jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  c     loop.cycle;
  p     loop.policy;
  v_len interval;
  a     record;
  b     record;
  tr    record;
  td    record;
  v_num jsonb;
  v_bad text;
BEGIN
  SELECT * INTO c FROM loop.cycle WHERE id = p_cycle;
  p := loop.effective_policy(c.route);
  v_len := greatest(p.watch_window, interval '1 day');
  SELECT count(*) AS n, count(*) FILTER (WHERE fb_regen) AS regen,
         count(*) FILTER (WHERE fb_explicit <> 0) AS rated,
         count(*) FILTER (WHERE fb_explicit < 0) AS down INTO a
    FROM obs.inference_log WHERE tenant_id = c.tenant_id AND route = c.route
     AND adapter_id = c.adapter_id AND created_at >= c.promoted_at;
  SELECT count(*) AS n, count(*) FILTER (WHERE fb_regen) AS regen,
         count(*) FILTER (WHERE fb_explicit <> 0) AS rated,
         count(*) FILTER (WHERE fb_explicit < 0) AS down INTO b
    FROM obs.inference_log WHERE tenant_id = c.tenant_id AND route = c.route
     AND created_at >= c.promoted_at - v_len AND created_at < c.promoted_at
     AND adapter_id IS DISTINCT FROM c.adapter_id
     AND (c.previous_prod_id IS NULL OR adapter_id = c.previous_prod_id);
  SELECT * INTO tr FROM loop.prop_test(b.regen, b.n, a.regen, a.n);
  SELECT * INTO td FROM loop.prop_test(b.down, b.rated, a.down, a.rated);
  v_num := jsonb_build_object('new_prod', c.adapter_id, 'previous_prod', c.previous_prod_id,
    'since', c.promoted_at, 'before_from', c.promoted_at - v_len, 'until', now(),
    'regen_rate', jsonb_build_object('before_n', b.n, 'before', tr.rate1, 'after_n', a.n,
                                     'after', tr.rate2, 'z', tr.z, 'p_value', tr.p_value),
    'thumbs_down_rate', jsonb_build_object('before_n', b.rated, 'before', td.rate1,
                                           'after_n', a.rated, 'after', td.rate2, 'z', td.z,
                                           'p_value', td.p_value),
    'alpha', p.watch_alpha, 'min_n', p.watch_min_n,
    'test', 'one-sided two-proportion z (pooled)');
  IF least(b.n, a.n) >= p.watch_min_n AND tr.p_value < p.watch_alpha THEN
    v_bad := 'regen_rate';
  ELSIF least(b.rated, a.rated) >= p.watch_min_n AND td.p_value < p.watch_alpha THEN
    v_bad := 'thumbs_down_rate';
  END IF;
  RETURN QUERY SELECT v_bad IS NOT NULL, now() >= c.watch_until, v_bad,
    CASE WHEN v_bad = 'regen_rate'
           THEN format('regenerate rate rose from %s to %s after promotion (p = %s < %s)',
                       round(tr.rate1::numeric, 4), round(tr.rate2::numeric, 4),
                       round(tr.p_value::numeric, 5), p.watch_alpha)
         WHEN v_bad = 'thumbs_down_rate'
           THEN format('thumbs-down rate rose from %s to %s after promotion (p = %s < %s)',
                       round(td.rate1::numeric, 4), round(td.rate2::numeric, 4),
                       round(td.p_value::numeric, 5), p.watch_alpha)
         ELSE format('guards hold: regen %s -> %s (n %s/%s), thumbs-down %s -> %s (n %s/%s)',
                     round(tr.rate1::numeric, 4), round(tr.rate2::numeric, 4), b.n, a.n,
                     round(td.rate1::numeric, 4), round(td.rate2::numeric, 4), b.rated, a.rated)
    END, v_num;
END
$$;

-- From an adapter back to what made it: one row per thing, in order: the adapter, its cycle
-- (trigger and values, method and hyperparameters), the snapshot, each example, each source
-- log row still present (forgotten ones are gone), the eval results, the experiment numbers
-- and decision, the watch, every cycle transition and every registry event.
--   SELECT step, ref, detail FROM loop.provenance('support-20261201120000-1a2b3c4d');
CREATE OR REPLACE FUNCTION loop.provenance(p_adapter text)
RETURNS TABLE (ord int, step text, ref text, detail jsonb)
LANGUAGE sql STABLE AS $$
  WITH a AS (SELECT * FROM serve.adapter WHERE id = p_adapter),
  c AS (SELECT * FROM loop.cycle WHERE adapter_id = p_adapter ORDER BY id DESC LIMIT 1),
  s AS (SELECT sn.* FROM train.dataset_snapshot sn JOIN a ON sn.id = a.dataset_snapshot_id),
  e AS (SELECT x.* FROM train.dataset_example x JOIN s ON x.snapshot_id = s.id)
  SELECT 1, 'adapter', a.id, to_jsonb(a) - 'eval_summary' FROM a
  UNION ALL
  SELECT 2, 'cycle', c.id::text, jsonb_build_object('state', c.state, 'created_at', c.created_at,
         'finished_at', c.finished_at, 'method', c.method, 'method_reason', c.method_reason,
         'hyperparameters', c.hyperparameters, 'signal_counts', c.signal_counts,
         'training_run_id', c.training_run_id, 'attempts', c.attempts, 'error', c.error) FROM c
  UNION ALL
  SELECT 3, 'trigger', c.trigger, c.trigger_values FROM c
  UNION ALL
  SELECT 4, 'snapshot', s.id::text, jsonb_build_object('method', s.method, 'counts', s.counts,
         'n_train', s.n_train, 'n_eval', s.n_eval, 'set_hash', s.set_hash,
         'created_at', s.created_at, 'tainted_at', s.tainted_at, 'query_sql', s.query_sql) FROM s
  UNION ALL
  SELECT 5, 'example', encode(e.example_hash, 'hex'),
         jsonb_build_object('split', e.split, 'log_ids', e.log_ids) FROM e
  UNION ALL
  SELECT 6, 'log_row', l.id::text, jsonb_build_object('created_at', l.created_at,
         'adapter_id', l.adapter_id, 'request_id', l.request_id, 'fb_explicit', l.fb_explicit,
         'fb_regen', l.fb_regen, 'fb_edited', l.fb_edited, 'user_hash', encode(l.user_hash, 'hex'))
    FROM obs.inference_log l
   WHERE l.id IN (SELECT unnest(e.log_ids) FROM e) AND l.tenant_id = (SELECT tenant_id FROM a)
  UNION ALL
  SELECT 7, 'eval', r.suite_id || '/' || r.metric, jsonb_build_object('score', r.score,
         'judge_model', r.judge_model, 'judged_at', r.judged_at)
    FROM train.eval_result r WHERE r.adapter_id = p_adapter
  UNION ALL
  SELECT 8, 'gate', c.id::text, jsonb_build_object('current_prod', c.current_prod_id,
         'blockers', c.blockers, 'eval_scores', c.eval_scores) FROM c
  UNION ALL
  SELECT 9, 'experiment', c.id::text, jsonb_build_object('canary_pct', c.canary_pct,
         'canary_started_at', c.canary_started_at, 'numbers', c.experiment) FROM c
  UNION ALL
  SELECT 10, 'decision', c.decision, jsonb_build_object('code', c.decision_code,
         'reason', c.decision_reason, 'previous_prod_id', c.previous_prod_id,
         'promoted_at', c.promoted_at) FROM c WHERE c.decision IS NOT NULL
  UNION ALL
  SELECT 11, 'watch', c.id::text, jsonb_build_object('watch_until', c.watch_until, 'numbers', c.watch)
    FROM c WHERE c.watch IS NOT NULL
  UNION ALL
  SELECT 12, 'cycle_event', ev.id::text, jsonb_build_object('from', ev.from_state, 'to', ev.to_state,
         'at', ev.at, 'worker_id', ev.worker_id, 'note', ev.note, 'inputs', ev.inputs)
    FROM loop.cycle_event ev JOIN c ON ev.cycle_id = c.id
  UNION ALL
  SELECT 13, 'adapter_event', ae.id::text, jsonb_build_object('old_status', ae.old_status,
         'new_status', ae.new_status, 'traffic_pct', ae.new_traffic_pct, 'actor', ae.actor,
         'reason', ae.reason, 'at', ae.at)
    FROM serve.adapter_event ae WHERE ae.adapter_id = p_adapter
  ORDER BY 1, 3
$$;
COMMENT ON FUNCTION loop.provenance(text) IS
  'From an adapter back to its loop cycle, trigger, snapshot, examples, source log rows, evals, '
  'experiment, decision, watch and events: one row per thing.';

-- Row-level security and privileges of the loop schema, as for the other tables
-- (core/tenant_isolation.sql, core/grants.sql): the API's cft_app sees its tenant's rows,
-- cft_release and cft_dashboard read everything; the kill switch changes only through
-- loop.set_control.
ALTER TABLE loop.policy ENABLE ROW LEVEL SECURITY;
ALTER TABLE loop.cycle ENABLE ROW LEVEL SECURITY;
ALTER TABLE loop.cycle_event ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON loop.policy TO cft_app
  USING (tenant_id = auth.current_tenant_id()) WITH CHECK (tenant_id = auth.current_tenant_id());
CREATE POLICY tenant_isolation ON loop.cycle TO cft_app
  USING (tenant_id = auth.current_tenant_id()) WITH CHECK (tenant_id = auth.current_tenant_id());
CREATE POLICY tenant_isolation ON loop.cycle_event TO cft_app
  USING (tenant_id = auth.current_tenant_id()) WITH CHECK (tenant_id = auth.current_tenant_id());
CREATE POLICY read_all ON loop.policy FOR SELECT TO cft_dashboard, cft_release USING (true);
CREATE POLICY read_all ON loop.cycle FOR SELECT TO cft_dashboard, cft_release USING (true);
CREATE POLICY read_all ON loop.cycle_event FOR SELECT TO cft_dashboard, cft_release USING (true);
-- One row, the same for every tenant: readable by all, written only through loop.set_control.
ALTER TABLE loop.control ENABLE ROW LEVEL SECURITY;
CREATE POLICY read_all ON loop.control FOR SELECT TO cft_app, cft_dashboard, cft_release USING (true);

-- The kill switch: who and why are kept with it.
CREATE OR REPLACE FUNCTION loop.set_control(p_paused boolean, p_reason text, p_by text)
RETURNS loop.control LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public AS $$
DECLARE
  k loop.control;
BEGIN
  IF p_paused AND nullif(btrim(coalesce(p_reason, '')), '') IS NULL THEN
    RAISE invalid_parameter_value USING MESSAGE = 'stopping the loop needs a reason';
  END IF;
  UPDATE loop.control SET paused = p_paused, reason = p_reason,
         changed_by = coalesce(p_by, session_user), changed_at = now()
  RETURNING * INTO k;
  RETURN k;
END
$$;

GRANT USAGE ON SCHEMA loop TO cft_app, cft_release, cft_dashboard;
GRANT SELECT, INSERT, UPDATE ON loop.policy TO cft_app;
GRANT SELECT ON loop.cycle, loop.cycle_event, loop.control TO cft_app;
GRANT SELECT ON loop.policy, loop.cycle, loop.cycle_event, loop.control TO cft_release, cft_dashboard;
-- Owner-rights functions: for the API role (and release managers), not PUBLIC; the read-only
-- dashboard role runs no owner-rights function (it reads the loop's tables directly).
REVOKE EXECUTE ON FUNCTION loop.route_tenant(text), loop.effective_policy(text),
  loop.signal_counts(text, timestamptz), loop.last_cycle_at(text), loop.trigger_volume(text),
  loop.trigger_schedule(text), loop.trigger_decline(text), loop.trigger_drift(text),
  loop.trigger_forget(text), loop.limits(text), loop.start_due_cycles(),
  loop.canary_verdict(bigint), loop.watch_verdict(bigint),
  loop.set_control(boolean, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION loop.route_tenant(text), loop.effective_policy(text),
  loop.signal_counts(text, timestamptz), loop.last_cycle_at(text), loop.trigger_volume(text),
  loop.trigger_schedule(text), loop.trigger_decline(text), loop.trigger_drift(text),
  loop.trigger_forget(text), loop.limits(text)
  TO cft_app, cft_release;
GRANT EXECUTE ON FUNCTION loop.set_control(boolean, text, text) TO cft_app;
"""

DOWNGRADE_SQL = r"""
DROP SCHEMA loop CASCADE;
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
