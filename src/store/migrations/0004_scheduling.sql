-- Scheduling: queue position and gang leaf limit of each instance, and
-- per-tenant quotas. See docs/scheduler.md ("Wiring into svd").

-- Written by every queue pass for the PENDING instances it saw: the 1-based
-- rank among waiting instances (0 once placed). state_reason holds the why.
-- max_leaves limits how many leaf switches a gang may span (0: no limit).
ALTER TABLE instances
  ADD COLUMN queue_position integer NOT NULL DEFAULT 0 CHECK (queue_position >= 0),
  ADD COLUMN max_leaves integer NOT NULL DEFAULT 0 CHECK (max_leaves BETWEEN 0 AND 16);

-- A tenant without a row gets svd's defaults (see docs/scheduler.md).
CREATE TABLE tenant_quotas (
  tenant_id         text PRIMARY KEY REFERENCES tenants (id),
  gpus_in_use_max   integer NOT NULL CHECK (gpus_in_use_max BETWEEN 0 AND 1000000),
  pending_count_max integer NOT NULL CHECK (pending_count_max BETWEEN 0 AND 1000),
  updated_at        timestamptz NOT NULL
);
