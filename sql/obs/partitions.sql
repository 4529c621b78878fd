-- Weekly partitions of obs.inference_log: create ahead, rescue rows from DEFAULT, drop old ones.
-- Weeks start on Monday 00:00 UTC; a partition is named inference_log_<ISO year>w<ISO week>.

CREATE OR REPLACE FUNCTION obs.week_start(p_ts timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT date_trunc('week', p_ts AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
$$;

CREATE OR REPLACE FUNCTION obs.partition_name(p_week_start timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT 'inference_log_' || to_char(p_week_start AT TIME ZONE 'UTC', 'IYYY"w"IW')
$$;

-- The weekly partitions that exist, with their bounds read from the catalog.
CREATE OR REPLACE VIEW obs.inference_log_partition AS
SELECT c.relname::text AS name,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz
         AS from_at,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz
         AS to_at
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'obs.inference_log'::regclass
   AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT';

COMMENT ON COLUMN obs.inference_log_partition.name IS
  'The partition''s table in schema obs: inference_log_<ISO year>w<ISO week>.';
COMMENT ON COLUMN obs.inference_log_partition.from_at IS
  'Start of its week, Monday 00:00 UTC (inclusive bound).';
COMMENT ON COLUMN obs.inference_log_partition.to_at IS
  'End of its week (exclusive bound): obs.drop_partitions '
  'drops it once this is past the retention cutoff.';

-- Create the week containing p_ts if missing. Rows of that week already sitting in DEFAULT are
-- moved into the new partition in the same transaction, so creating a partition never fails
-- because of them. Returns true if a partition was created.
CREATE OR REPLACE FUNCTION obs.ensure_week_partition(p_ts timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
  v_from timestamptz := obs.week_start(p_ts);
  v_to   timestamptz := v_from + interval '7 days';
  v_name text := obs.partition_name(v_from);
BEGIN
  IF to_regclass('obs.' || v_name) IS NOT NULL THEN
    RETURN false;
  END IF;
  -- Serialise concurrent creators; DEFAULT must not take new rows of this week meanwhile.
  LOCK TABLE obs.inference_log_default IN ACCESS EXCLUSIVE MODE;
  IF to_regclass('obs.' || v_name) IS NOT NULL THEN
    RETURN false;
  END IF;
  EXECUTE format('CREATE TABLE obs.%I (LIKE obs.inference_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                 v_name);
  -- Owned like its parent (cft_owner: core/ownership.sql), whoever creates it.
  EXECUTE format('ALTER TABLE obs.%I OWNER TO %s', v_name,
                 (SELECT c.relowner::regrole FROM pg_class c WHERE c.oid = 'obs.inference_log'::regclass));
  -- Move this week's stray rows with their ids: they keep their request keys.
  EXECUTE format(
    'WITH moved AS (DELETE FROM ONLY obs.inference_log_default
                     WHERE created_at >= $1 AND created_at < $2 RETURNING *)
     INSERT INTO obs.%I SELECT * FROM moved', v_name) USING v_from, v_to;
  EXECUTE format('ALTER TABLE obs.%I ADD CONSTRAINT %I CHECK (created_at >= %L AND created_at < %L)',
                 v_name, v_name || '_range', v_from, v_to);
  EXECUTE format('ALTER TABLE obs.inference_log ATTACH PARTITION obs.%I FOR VALUES FROM (%L) TO (%L)',
                 v_name, v_from, v_to);
  EXECUTE format('ALTER TABLE obs.%I DROP CONSTRAINT %I', v_name, v_name || '_range');
  RETURN true;
END
$$;

-- Create weekly partitions from the week of p_from through p_weeks_ahead weeks after now().
CREATE OR REPLACE FUNCTION obs.create_partitions(p_weeks_ahead int DEFAULT 4,
                                                    p_from timestamptz DEFAULT now())
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
  v_week timestamptz := obs.week_start(least(p_from, now()));
BEGIN
  WHILE v_week <= obs.week_start(now()) + make_interval(weeks => p_weeks_ahead) LOOP
    IF obs.ensure_week_partition(v_week) THEN
      RETURN NEXT obs.partition_name(v_week);
    END IF;
    v_week := v_week + interval '7 days';
  END LOOP;
END
$$;

-- Give every row in DEFAULT within the window (newer than p_keep, no later than p_weeks_ahead
-- weeks after this one) a weekly partition of its own. Returns the partitions created. Rows
-- older than the retention are left for drop_partitions; rows further ahead stay in DEFAULT
-- until their week comes within reach. The window bounds the partitions one writer can cause
-- (each is ten indexes and a lock in every query of the whole log), whatever created_at it sets.
CREATE OR REPLACE FUNCTION obs.move_default_rows(p_keep interval DEFAULT NULL,
                                                 p_weeks_ahead int DEFAULT 4)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
  v_week timestamptz;
BEGIN
  FOR v_week IN
    SELECT DISTINCT obs.week_start(created_at) FROM ONLY obs.inference_log_default
     WHERE (p_keep IS NULL OR created_at >= obs.week_start(now() - p_keep))
       AND created_at < obs.week_start(now()) + make_interval(weeks => p_weeks_ahead + 1)
     ORDER BY 1
  LOOP
    IF obs.ensure_week_partition(v_week) THEN
      RETURN NEXT obs.partition_name(v_week);
    END IF;
  END LOOP;
END
$$;

-- Drop weekly partitions whose whole range is older than now() - p_keep, delete DEFAULT rows
-- that old, and forget their request keys. Returns the partitions dropped.
CREATE OR REPLACE FUNCTION obs.drop_partitions(p_keep interval)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
  v_cutoff timestamptz := now() - p_keep;
  v_part record;
BEGIN
  FOR v_part IN SELECT name FROM obs.inference_log_partition WHERE to_at <= v_cutoff ORDER BY from_at
  LOOP
    EXECUTE format('DROP TABLE obs.%I', v_part.name);
    RETURN NEXT v_part.name;
  END LOOP;
  DELETE FROM ONLY obs.inference_log_default WHERE created_at < v_cutoff;
  DELETE FROM obs.request_key WHERE created_at < v_cutoff;
END
$$;
