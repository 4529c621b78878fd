-- Privileges of the PostgreSQL roles created in core/roles.sql.

-- The API's login acts as the owner (core/ownership.sql) and, per request, as one of the roles
-- below (SET LOCAL ROLE).
GRANT cft_owner, cft_app, cft_release, cft_dashboard TO cft_api;
GRANT USAGE ON SCHEMA obs, serve, train, auth TO cft_app, cft_release, cft_dashboard;

-- cft_app: what the API does on behalf of one tenant (rows limited by RLS).
GRANT SELECT, UPDATE ON tenant TO cft_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON obs.inference_log TO cft_app;
GRANT SELECT ON obs.request_key, obs.inference_log_partition TO cft_app;
GRANT USAGE ON SEQUENCE obs.inference_log_id_seq TO cft_app;
GRANT SELECT, INSERT, UPDATE ON serve.route, serve.adapter TO cft_app;
GRANT SELECT ON serve.adapter_event TO cft_app;
GRANT SELECT, INSERT, UPDATE ON train.dataset_snapshot, train.dataset_example,
  train.training_run, train.promotion_policy TO cft_app;
GRANT SELECT, INSERT ON train.eval_result TO cft_app;
GRANT SELECT ON train.eval_result_latest, train.eval_result_counted TO cft_app;

GRANT DELETE ON train.promotion_policy TO cft_app;
GRANT EXECUTE ON FUNCTION auth.current_tenant_id() TO cft_app, cft_release, cft_dashboard;

-- cft_release: read what a promotion decision needs; change only status and traffic.
GRANT SELECT ON tenant, serve.route, serve.adapter, serve.adapter_event, train.eval_result,
  train.eval_result_latest, train.eval_result_counted, train.promotion_policy, train.training_run,
  train.dataset_snapshot TO cft_release;
GRANT UPDATE (status, traffic_pct) ON serve.adapter TO cft_release;

-- cft_dashboard: read-only on traffic, registry and results.
GRANT SELECT ON tenant, obs.inference_log, serve.route, serve.adapter, serve.adapter_event,
  train.eval_result, train.eval_result_latest, train.eval_result_counted, train.promotion_policy,
  train.training_run, train.dataset_snapshot TO cft_dashboard;
