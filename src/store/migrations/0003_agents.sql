-- Node agents: credentials, per-node start confirmations, telemetry
-- aggregates and the idle auto-stop policy. See docs/agent.md.

-- A node agent authenticates with its own credential, never a tenant key.
-- Only the SHA-256 of the secret is stored; the credential names the node it
-- may register as.
CREATE TABLE node_credentials (
  id            text PRIMARY KEY,
  node_name     text NOT NULL,
  secret_sha256 text NOT NULL CHECK (length(secret_sha256) = 64),
  created_at    timestamptz NOT NULL,
  revoked_at    timestamptz
);
CREATE INDEX node_credentials_node ON node_credentials (node_name);

-- One row per node of an instance that confirmed the instance runs. The
-- instance is RUNNING only when every node holding its GPUs has a row.
CREATE TABLE instance_node_starts (
  instance_id  text NOT NULL REFERENCES instances (id),
  node_id      text NOT NULL REFERENCES nodes (id),
  confirmed_at timestamptz NOT NULL,
  PRIMARY KEY (instance_id, node_id)
);

-- Per instance and minute: what the SLA monitor aggregates per hour.
-- Samples add up, so batches arriving in any order merge exactly.
-- Rows older than the retention (svd --telemetry-retention-days) are deleted.
CREATE TABLE instance_telemetry_minutes (
  instance_id             text NOT NULL REFERENCES instances (id),
  minute                  timestamptz NOT NULL,
  gpu_samples             integer NOT NULL DEFAULT 0,
  -- Samples where the GPU was healthy (no XID, no uncorrected ECC) and ran
  -- at full clocks (no throttling other than idle/app settings).
  gpu_samples_healthy     integer NOT NULL DEFAULT 0,
  utilization_pct_sum     bigint NOT NULL DEFAULT 0,
  xid_errors              integer NOT NULL DEFAULT 0,
  storage_probes          integer NOT NULL DEFAULT 0,
  storage_bytes_written   bigint NOT NULL DEFAULT 0,
  storage_duration_us     bigint NOT NULL DEFAULT 0,
  -- Slowest probe of the minute, in bytes per second.
  storage_min_bytes_per_s bigint,
  -- Counts per fixed latency bucket (bounds in docs/agent.md); added up.
  latency_counts          bigint[] NOT NULL DEFAULT '{}',
  PRIMARY KEY (instance_id, minute)
);
CREATE INDEX instance_telemetry_minutes_minute ON instance_telemetry_minutes (minute);

-- Idle auto-stop: stop after idle_seconds with average GPU utilization below
-- idle_utilization_pct. idle_since is when the current idle streak began.
ALTER TABLE instances
  ADD COLUMN idle_seconds integer NOT NULL DEFAULT 0
      CHECK (idle_seconds BETWEEN 0 AND 604800),
  ADD COLUMN idle_utilization_pct integer NOT NULL DEFAULT 0
      CHECK (idle_utilization_pct BETWEEN 0 AND 100),
  ADD COLUMN idle_since timestamptz;
