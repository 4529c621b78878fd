-- PostgreSQL roles for people and services that use SQL directly. Roles are cluster-wide, so
-- they are created only if missing, and never dropped.
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cft_app') THEN
    CREATE ROLE cft_app NOLOGIN;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cft_release') THEN
    CREATE ROLE cft_release NOLOGIN;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cft_dashboard') THEN
    CREATE ROLE cft_dashboard NOLOGIN;
  END IF;
  -- Owns cft's schemas and everything in them (core/ownership.sql); nobody logs in as it.
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cft_owner') THEN
    CREATE ROLE cft_owner NOLOGIN;
  END IF;
  -- The API process's login (app.core.db.api_database_url): a member of cft_owner, never a
  -- superuser, so nothing a request runs, RESET ROLE included, reaches beyond cft's schema.
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cft_api') THEN
    CREATE ROLE cft_api LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
  END IF;
END
$$;
