-- Hourly GPU utilization per node, for the operator dashboard's fleet charts
-- (docs/web.md). Every svd replica adds what its agents' telemetry streams
-- carried (the sum of the samples' utilization percent and their count)
-- every few seconds; rows older than 35 days are dropped as it goes.
CREATE TABLE node_gpu_utilization_hourly (
  node_name       text NOT NULL,
  hour            timestamptz NOT NULL,
  utilization_sum bigint NOT NULL CHECK (utilization_sum >= 0),
  sample_count    bigint NOT NULL CHECK (sample_count >= 0),
  PRIMARY KEY (node_name, hour)
);
CREATE INDEX node_gpu_utilization_hourly_hour ON node_gpu_utilization_hourly (hour);
