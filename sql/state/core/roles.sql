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
END
$$;
