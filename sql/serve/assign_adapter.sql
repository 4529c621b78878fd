-- Sticky canary split. A user's bucket in [0, 10000) is the first 32 bits of
-- md5(<experiment>:<user_key>) modulo 10000; the router computes the same in Python.
-- Canaries of a route take consecutive bucket ranges (ordered by created_at, id) sized by their
-- traffic_pct (hundredths of a percent); every other bucket goes to the route's prod adapter.
CREATE OR REPLACE FUNCTION serve.bucket(p_experiment text, p_user_key text) RETURNS int
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT (('x' || substr(md5(p_experiment || ':' || p_user_key), 1, 8))::bit(32)::bigint % 10000)::int
$$;

CREATE OR REPLACE FUNCTION serve.assign_adapter(tenant_id int, route text, user_key text)
RETURNS text LANGUAGE sql STABLE AS $$
  WITH r AS (
    SELECT coalesce(rt.experiment, rt.name) AS experiment FROM serve.route rt
     WHERE rt.tenant_id = $1 AND rt.name = $2
  ), b AS (
    SELECT serve.bucket(r.experiment, $3) AS bucket FROM r
  ), canary AS (
    SELECT a.id,
           sum((a.traffic_pct * 100)::int) OVER (ORDER BY a.created_at, a.id) AS upper_bucket
      FROM serve.adapter a
     WHERE a.tenant_id = $1 AND a.route = $2 AND a.status = 'canary' AND a.traffic_pct > 0
  )
  SELECT coalesce(
    (SELECT c.id FROM canary c, b WHERE b.bucket < c.upper_bucket ORDER BY c.upper_bucket LIMIT 1),
    (SELECT a.id FROM serve.adapter a WHERE a.tenant_id = $1 AND a.route = $2 AND a.status = 'prod'))
$$;
COMMENT ON FUNCTION serve.assign_adapter(int, text, text) IS
  'The adapter a user gets now on a tenant''s route: a canary for exactly traffic_pct % of buckets, else prod.';
