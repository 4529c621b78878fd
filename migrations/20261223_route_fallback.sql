-- No silent base answers: what answers a call whose assigned adapter cannot is the route's
-- policy, none by default (the router waits for the load, then a 503 that says so).
ALTER TABLE serve.route ADD COLUMN fallback text NOT NULL DEFAULT 'none'
  CHECK (fallback IN ('none', 'prod', 'base'));
