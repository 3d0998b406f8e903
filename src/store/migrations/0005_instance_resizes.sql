-- Every resize of a running instance, so that billing charges each minute at
-- the GPU count the instance had when that minute started (a resize ends one
-- RUNNING interval and starts the next at the same moment).
CREATE TABLE instance_resizes (
  id             bigserial PRIMARY KEY,
  instance_id    text NOT NULL REFERENCES instances (id),
  at             timestamptz NOT NULL,
  from_gpu_count integer NOT NULL CHECK (from_gpu_count BETWEEN 1 AND 128),
  to_gpu_count   integer NOT NULL CHECK (to_gpu_count BETWEEN 1 AND 128)
);
CREATE INDEX instance_resizes_instance ON instance_resizes (instance_id, at);
