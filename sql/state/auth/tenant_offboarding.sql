-- No foreign key to tenant: the audit outlives the tenant it describes.
CREATE TABLE auth.tenant_offboarding (
  id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant_id         int NOT NULL,
  tenant_name       text NOT NULL,
  requested_by      text NOT NULL,
  status            text NOT NULL DEFAULT 'unloading'
                    CHECK (status IN ('unloading', 'artefacts', 'done')),
  retired_adapters  text[] NOT NULL DEFAULT '{}',
  forced            boolean NOT NULL DEFAULT false,
  counts            jsonb NOT NULL DEFAULT '{}',
  artefacts_pending text[] NOT NULL DEFAULT '{}',
  artefacts_deleted text[] NOT NULL DEFAULT '{}',
  started_at        timestamptz NOT NULL DEFAULT now(),
  data_deleted_at   timestamptz,
  finished_at       timestamptz
);
CREATE UNIQUE INDEX tenant_offboarding_open_idx ON auth.tenant_offboarding (tenant_id)
  WHERE status <> 'done';
CREATE INDEX tenant_offboarding_name_idx ON auth.tenant_offboarding (tenant_name, id);
