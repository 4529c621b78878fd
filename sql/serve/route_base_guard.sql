-- A route's base model is a base, never an adapter: a base_model naming an adapter (of any
-- tenant) would make the engine serve that adapter to the route's callers. Checked both ways,
-- as the owner (the caller's tenant may not see the other row), under one lock so a route and
-- an adapter of the same name cannot be written side by side.
CREATE OR REPLACE FUNCTION serve.route_base_guard() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('cft.route_base_guard'));
  IF TG_TABLE_NAME = 'route' THEN
    IF EXISTS (SELECT 1 FROM serve.adapter a WHERE a.id = NEW.base_model) THEN
      RAISE check_violation USING
        MESSAGE = pg_catalog.format('route %s: base model %s is the name of an adapter, not a base',
                                    NEW.name, NEW.base_model),
        HINT = 'A route''s base_model names a base model the engines serve (CFT_BASE_MODELS).';
    END IF;
  ELSIF EXISTS (SELECT 1 FROM serve.route r WHERE r.base_model = NEW.id) THEN
    RAISE check_violation USING
      MESSAGE = pg_catalog.format('adapter %s: a route names a base model of that name', NEW.id),
      HINT = 'Adapter names never equal a base model''s name.';
  END IF;
  RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION serve.route_base_guard() FROM PUBLIC;

CREATE OR REPLACE TRIGGER route_base_guard BEFORE INSERT OR UPDATE OF base_model ON serve.route
  FOR EACH ROW EXECUTE FUNCTION serve.route_base_guard();
CREATE OR REPLACE TRIGGER adapter_base_guard BEFORE INSERT OR UPDATE OF id ON serve.adapter
  FOR EACH ROW EXECUTE FUNCTION serve.route_base_guard();

-- An adapter serves its route's base: an adapter trained on another base is refused where it
-- is registered or moved (engines would load it onto a model it was not trained for), and a
-- route keeps its base while an adapter of it is a candidate, canary or prod. As the owner:
-- the caller's tenant may not see every row, and a key of another tenant sees nothing anyway.
CREATE OR REPLACE FUNCTION serve.adapter_base_binding() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_base text;
BEGIN
  IF TG_TABLE_NAME = 'adapter' THEN
    SELECT r.base_model INTO v_base FROM serve.route r
     WHERE r.name = NEW.route AND r.tenant_id = NEW.tenant_id;
    IF FOUND AND v_base IS DISTINCT FROM NEW.base_model THEN
      RAISE check_violation USING
        MESSAGE = pg_catalog.format('adapter %s is built on %s, but route %s serves %s',
                                    NEW.id, NEW.base_model, NEW.route, v_base),
        HINT = 'Train (or import) the adapter on the route''s base model.';
    END IF;
  ELSIF NEW.base_model IS DISTINCT FROM OLD.base_model AND EXISTS (
      SELECT 1 FROM serve.adapter a
       WHERE a.route = NEW.name AND a.tenant_id = NEW.tenant_id
         AND a.status IN ('candidate', 'canary', 'prod') AND a.base_model <> NEW.base_model) THEN
    RAISE check_violation USING
      MESSAGE = pg_catalog.format('route %s has adapters on %s: its base cannot become %s',
                                  NEW.name, OLD.base_model, NEW.base_model),
      HINT = 'Retire them first, or create a new route on the new base.';
  END IF;
  RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION serve.adapter_base_binding() FROM PUBLIC;

CREATE OR REPLACE TRIGGER adapter_base_binding
  BEFORE INSERT OR UPDATE OF base_model, route, tenant_id ON serve.adapter
  FOR EACH ROW EXECUTE FUNCTION serve.adapter_base_binding();
CREATE OR REPLACE TRIGGER route_base_binding BEFORE UPDATE OF base_model ON serve.route
  FOR EACH ROW EXECUTE FUNCTION serve.adapter_base_binding();
