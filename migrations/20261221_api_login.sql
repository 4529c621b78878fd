-- The API logs in as cft_api, a member of cft_owner (which comes to own cft's schemas through
-- core/ownership.sql), never as a superuser.
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cft_owner') THEN
    CREATE ROLE cft_owner NOLOGIN;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cft_api') THEN
    CREATE ROLE cft_api LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
  END IF;
END
$$;
