-- Tenants, users, API keys, nodes, instances and GPU reservations.
-- Times are timestamptz written by svd from its injected clock.

CREATE TABLE tenants (
  id           text PRIMARY KEY,
  name         text NOT NULL UNIQUE,
  billing_mode text NOT NULL DEFAULT 'prepaid'
               CHECK (billing_mode IN ('prepaid', 'postpaid')),
  created_at   timestamptz NOT NULL
);

CREATE TABLE users (
  id         text PRIMARY KEY,
  tenant_id  text NOT NULL REFERENCES tenants (id),
  email      text NOT NULL UNIQUE,
  role       text NOT NULL CHECK (role IN ('member', 'operator')),
  created_at timestamptz NOT NULL
);

-- Only the SHA-256 of a key's secret is stored; the id is public.
CREATE TABLE api_keys (
  id            text PRIMARY KEY,
  user_id       text NOT NULL REFERENCES users (id),
  tenant_id     text NOT NULL REFERENCES tenants (id),
  secret_sha256 text NOT NULL CHECK (length(secret_sha256) = 64),
  created_at    timestamptz NOT NULL,
  revoked_at    timestamptz
);
CREATE INDEX api_keys_user ON api_keys (user_id);

-- Idempotency of admin calls that create tenants.
CREATE TABLE admin_requests (
  request_id  text PRIMARY KEY,
  fingerprint text NOT NULL,
  tenant_id   text NOT NULL REFERENCES tenants (id),
  created_at  timestamptz NOT NULL
);

CREATE TABLE nodes (
  id                text PRIMARY KEY,
  name              text NOT NULL UNIQUE,
  zone              text NOT NULL,
  pod               text NOT NULL,
  leaf_switch       text NOT NULL,
  gpu_model         text NOT NULL,
  gpu_count         integer NOT NULL CHECK (gpu_count BETWEEN 1 AND 8),
  state             text NOT NULL
                    CHECK (state IN ('ready', 'cordoned', 'draining', 'down')),
  simulated         boolean NOT NULL DEFAULT false,
  last_heartbeat_at timestamptz,
  created_at        timestamptz NOT NULL
);

CREATE TABLE instances (
  id                  text PRIMARY KEY,
  tenant_id           text NOT NULL REFERENCES tenants (id),
  name                text NOT NULL,
  gpu_count           integer NOT NULL
                      CHECK (gpu_count BETWEEN 1 AND 128
                             AND (gpu_count <= 8 OR gpu_count % 8 = 0)),
  gpu_model           text NOT NULL,
  image               text NOT NULL,
  state               text NOT NULL
                      CHECK (state IN ('PENDING', 'SCHEDULED', 'STARTING', 'RUNNING',
                                       'STOPPING', 'STOPPED', 'DELETED', 'FAILED')),
  state_reason        text NOT NULL DEFAULT '',
  request_id          text NOT NULL,
  request_fingerprint text NOT NULL,
  priority            integer NOT NULL DEFAULT 0,
  queue_seq           bigserial,
  created_at          timestamptz NOT NULL,
  updated_at          timestamptz NOT NULL,
  running_since       timestamptz,
  UNIQUE (tenant_id, request_id),
  CHECK (state <> 'FAILED' OR state_reason <> '')
);
CREATE INDEX instances_tenant_page ON instances (tenant_id, created_at, id);
CREATE INDEX instances_active ON instances (state, priority, queue_seq)
  WHERE state IN ('PENDING', 'SCHEDULED', 'STARTING', 'STOPPING');

-- One row per reserved GPU. The primary key is what makes a double booking
-- impossible, whatever the scheduler or the number of svd replicas.
CREATE TABLE gpu_reservations (
  node_id     text NOT NULL REFERENCES nodes (id),
  gpu_index   integer NOT NULL CHECK (gpu_index BETWEEN 0 AND 7),
  instance_id text NOT NULL REFERENCES instances (id),
  reserved_at timestamptz NOT NULL,
  PRIMARY KEY (node_id, gpu_index)
);
CREATE INDEX gpu_reservations_instance ON gpu_reservations (instance_id);

-- Every state transition, with its time and reason.
CREATE TABLE instance_events (
  id          bigserial PRIMARY KEY,
  instance_id text NOT NULL REFERENCES instances (id),
  at          timestamptz NOT NULL,
  from_state  text,
  to_state    text NOT NULL,
  reason      text NOT NULL
);
CREATE INDEX instance_events_instance ON instance_events (instance_id, id);
