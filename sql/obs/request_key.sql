COMMENT ON TABLE obs.request_key IS
  'One row per logged (tenant, request_id): the global uniqueness arbiter and lookup index.';
COMMENT ON COLUMN obs.request_key.tenant_id IS 'The tenant that logged the request.';
COMMENT ON COLUMN obs.request_key.request_id IS
  'The request''s id (obs.inference_log.request_id): unique per tenant across every partition.';
COMMENT ON COLUMN obs.request_key.log_id IS 'id of the log row it names.';
COMMENT ON COLUMN obs.request_key.created_at IS
  'created_at of that log row: with log_id, the row''s primary key (and so its partition).';

-- Keeps obs.request_key in step with obs.inference_log: a second row with the same
-- (tenant_id, request_id) is refused with unique_violation, whatever its created_at.
-- A row that keeps its id (moved between partitions by maintenance) passes. Keys are removed
-- by the retention and forget functions, not by a DELETE trigger, so that moving rows out of
-- DEFAULT keeps them.
CREATE OR REPLACE FUNCTION obs.inference_log_request_key() RETURNS trigger

-- SECURITY DEFINER: it writes obs.request_key, which its callers may only read.

LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO obs.request_key (tenant_id, request_id, log_id, created_at)
    VALUES (NEW.tenant_id, NEW.request_id, NEW.id, NEW.created_at)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND AND NOT EXISTS (
         SELECT 1 FROM obs.request_key
          WHERE tenant_id = NEW.tenant_id AND request_id = NEW.request_id AND log_id = NEW.id) THEN
      RAISE unique_violation USING
        MESSAGE = format('request_id %s is already logged for tenant %s', NEW.request_id, NEW.tenant_id),
        CONSTRAINT = 'request_key_pkey';
    END IF;
    RETURN NEW;
  END IF;
  RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER inference_log_request_key_ins
  BEFORE INSERT ON obs.inference_log
  FOR EACH ROW EXECUTE FUNCTION obs.inference_log_request_key();
