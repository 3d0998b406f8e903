-- Each fleet-utilization flush of an svd replica carries a key
-- ("<incarnation>:<sequence>"). The flush adds its sums only when its key
-- is new, in the same transaction, so a flush whose COMMIT was in doubt can
-- be sent again without counting its samples twice. Keys are kept a day.
CREATE TABLE node_utilization_flushes (
  flush_key  text PRIMARY KEY,
  applied_at timestamptz NOT NULL
);
CREATE INDEX node_utilization_flushes_applied_at ON node_utilization_flushes (applied_at);
