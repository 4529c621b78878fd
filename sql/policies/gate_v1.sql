-- The API replaces a route's own promotion rules; the global rules (route NULL) stay the
-- operator's, whatever tenant connection asks.
GRANT DELETE ON train.promotion_policy TO cft_app;
CREATE POLICY own_rules_only ON train.promotion_policy AS RESTRICTIVE FOR DELETE TO cft_app
  USING (route IS NOT NULL);
