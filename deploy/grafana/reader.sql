-- The login Grafana uses: a member of cft_dashboard (read-only on logs, registry and results;
-- row-level security lets it read every tenant). Run by the grafana-init service as
--   psql -v pw=... -f reader.sql
-- Safe to re-run: it creates the role once and sets the password every time.
SELECT format('CREATE ROLE cft_grafana LOGIN IN ROLE cft_dashboard PASSWORD %L', :'pw')
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cft_grafana') \gexec
SELECT format('ALTER ROLE cft_grafana WITH LOGIN PASSWORD %L', :'pw') \gexec
GRANT cft_dashboard TO cft_grafana;
-- A dashboard never writes and never holds the database for long.
ALTER ROLE cft_grafana SET default_transaction_read_only = on;
ALTER ROLE cft_grafana SET statement_timeout = '30s';
