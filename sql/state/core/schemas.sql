-- The extension and the schemas: obs (traffic), serve (registry and experiments), train
-- (datasets, training, evals), auth (keys, privacy), stats (statistics for experiments).

CREATE EXTENSION IF NOT EXISTS vector;

CREATE SCHEMA IF NOT EXISTS obs;
CREATE SCHEMA IF NOT EXISTS serve;
CREATE SCHEMA IF NOT EXISTS train;
CREATE SCHEMA IF NOT EXISTS auth;

CREATE SCHEMA IF NOT EXISTS stats;
