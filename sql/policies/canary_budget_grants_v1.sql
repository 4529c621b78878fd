-- serve.check_canary_budget_v1 runs with owner rights and locks serve.route rows (FOR UPDATE);
-- like the gate's helpers it is for the roles that write serve.adapter, not for PUBLIC: the
-- read-only cft_dashboard could otherwise hold locks on every route and stall promotions.
REVOKE EXECUTE ON FUNCTION serve.check_canary_budget_v1(text, text, numeric) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION serve.check_canary_budget_v1(text, text, numeric)
  TO cft_app, cft_release;
