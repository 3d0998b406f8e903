-- The SLA monitor (docs/sla.md): hourly rollups with their evidence and
-- verdicts, checkpoints of open hours, the judgement cursor and per-tenant
-- overrides. Replaces the per-minute telemetry table of 0003.

-- One row per judged instance-hour: the evidence (SlaWindowEvidence,
-- protobuf), the rent read from the ledger, each metric's verdict (with the
-- key and id of its refund transfer) and the nodes that reported.
CREATE TABLE sla_windows (
  instance_id          text NOT NULL,
  hour_start           timestamptz NOT NULL,
  -- No FOREIGN KEY: as on ledger_transfers, its per-row check would cost the
  -- judge of 100,000 instance-hours more than the rest of the insert; the
  -- tenant comes from the ledger's own charges.
  tenant_id            text NOT NULL,
  gpu_count            integer NOT NULL CHECK (gpu_count BETWEEN 1 AND 128),
  billed_from          timestamptz NOT NULL,
  billed_to            timestamptz NOT NULL,
  rent_micros          bigint NOT NULL CHECK (rent_micros > 0),
  evidence             bytea NOT NULL,
  verdicts             jsonb NOT NULL,
  breached_metrics     text[] NOT NULL,
  refund_micros_total  bigint NOT NULL CHECK (refund_micros_total >= 0),
  node_names           text[] NOT NULL,
  late_samples_ignored bigint NOT NULL DEFAULT 0,
  judged_at            timestamptz NOT NULL,
  PRIMARY KEY (instance_id, hour_start),
  CHECK (billed_to > billed_from AND billed_from >= hour_start
         AND billed_to <= hour_start + interval '1 hour')
);
CREATE INDEX sla_windows_hour ON sla_windows (hour_start);

-- Open hours, checkpointed by each replica every few seconds and at
-- shutdown; merged across replicas when the hour is judged, then deleted.
CREATE TABLE sla_window_checkpoints (
  instance_id text NOT NULL,
  hour_start  timestamptz NOT NULL,
  replica     text NOT NULL,
  gpu_count   integer NOT NULL CHECK (gpu_count BETWEEN 1 AND 128),
  evidence    bytea NOT NULL,
  updated_at  timestamptz NOT NULL,
  PRIMARY KEY (instance_id, hour_start, replica)
);
CREATE INDEX sla_window_checkpoints_hour ON sla_window_checkpoints (hour_start);

-- Every hour before judged_before is judged.
CREATE TABLE sla_cursor (
  id            integer PRIMARY KEY CHECK (id = 1),
  judged_before timestamptz,
  updated_at    timestamptz
);
INSERT INTO sla_cursor (id) VALUES (1);

-- Enterprise contracts: per-tenant replacements of the configured
-- definitions, one per metric.
CREATE TABLE sla_tenant_overrides (
  tenant_id           text NOT NULL REFERENCES tenants (id),
  metric              text NOT NULL
                      CHECK (metric IN ('gpu_usable', 'storage_write', 'network_latency')),
  aggregation         text NOT NULL
                      CHECK (aggregation IN ('share_of_time', 'mean', 'minimum', 'p99')),
  comparison          text NOT NULL CHECK (comparison IN ('at_least', 'at_most')),
  threshold           bigint NOT NULL CHECK (threshold >= 0),
  refund_basis_points integer NOT NULL CHECK (refund_basis_points BETWEEN 0 AND 10000),
  updated_at          timestamptz NOT NULL,
  PRIMARY KEY (tenant_id, metric)
);

-- The judge sums each instance-hour's charges by usage minute. Charges are
-- written in minute order, so a BRIN index finds an hour cheaply and costs
-- metering almost nothing to maintain.
CREATE INDEX sla_ledger_charges_minute ON ledger_transfers USING brin (usage_minute);

-- Retired: per-minute telemetry rows grew with every instance-minute. The
-- SLA keeps hourly rollups (above); idle auto-stop keeps its streak on the
-- instance row.
DROP TABLE instance_telemetry_minutes;
