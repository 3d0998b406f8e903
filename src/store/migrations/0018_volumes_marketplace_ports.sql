-- Cloud disks (volumes), the public library, the app marketplace and node
-- port mapping. See docs/storage.md and docs/marketplace.md.

-- ---- Volumes -----------------------------------------------------------------

-- A node-local volume lives on one node (node_id, set when it is created on
-- a node or first attached to an instance placed on one); a network volume
-- attaches anywhere. Deleted volumes keep their row (billing, audit).
CREATE TABLE volumes (
  id                  text PRIMARY KEY,
  tenant_id           text NOT NULL REFERENCES tenants (id),
  name                text NOT NULL,
  size_gib            integer NOT NULL CHECK (size_gib BETWEEN 1 AND 65536),
  kind                text NOT NULL CHECK (kind IN ('node_local', 'network')),
  read_many           boolean NOT NULL DEFAULT false,
  node_id             text REFERENCES nodes (id),
  request_id          text NOT NULL,
  request_fingerprint text NOT NULL,
  created_at          timestamptz NOT NULL,
  updated_at          timestamptz NOT NULL,
  deleted_at          timestamptz,
  -- A move waiting for the detach from the old instance (MoveVolume).
  move_to_instance_id text REFERENCES instances (id),
  move_mount_path     text,
  UNIQUE (tenant_id, request_id),
  CHECK (kind = 'node_local' OR node_id IS NULL)
);
CREATE INDEX volumes_tenant_page ON volumes (tenant_id, created_at, id);
CREATE INDEX volumes_live ON volumes (created_at) WHERE deleted_at IS NULL;

-- One row per (volume, instance). 'attaching' and 'detaching' wait for the
-- node agents of a placed instance to confirm; confirmed_nodes holds the
-- nodes that did. A volume that is not read-many has at most one
-- attachment; a read-many volume has any number of read-only ones and at
-- most one writer. The partial unique index makes a second writer
-- impossible, however many attach calls race.
CREATE TABLE volume_attachments (
  volume_id       text NOT NULL REFERENCES volumes (id),
  instance_id     text NOT NULL REFERENCES instances (id),
  tenant_id       text NOT NULL REFERENCES tenants (id),
  read_only       boolean NOT NULL,
  mount_path      text NOT NULL,
  state           text NOT NULL CHECK (state IN ('attaching', 'attached', 'detaching')),
  confirmed_nodes text[] NOT NULL DEFAULT '{}',
  reason          text NOT NULL DEFAULT '',
  requested_at    timestamptz NOT NULL,
  confirmed_at    timestamptz,
  PRIMARY KEY (volume_id, instance_id),
  UNIQUE (instance_id, mount_path)
);
CREATE UNIQUE INDEX volume_attachments_one_writer ON volume_attachments (volume_id)
  WHERE NOT read_only;
CREATE INDEX volume_attachments_instance ON volume_attachments (instance_id);

-- ---- Public library ------------------------------------------------------------

-- Public models and datasets, managed by platform admins; mounted read-only
-- at /public/<name>.
CREATE TABLE library_items (
  name        text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
  kind        text NOT NULL CHECK (kind IN ('model', 'dataset')),
  size_bytes  bigint NOT NULL CHECK (size_bytes >= 0),
  source      text NOT NULL,
  description text NOT NULL DEFAULT '',
  created_at  timestamptz NOT NULL,
  deleted_at  timestamptz
);

CREATE TABLE instance_library_mounts (
  instance_id   text NOT NULL REFERENCES instances (id),
  name          text NOT NULL REFERENCES library_items (name),
  -- Nodes whose agent confirmed the mount (MountReport).
  mounted_nodes text[] NOT NULL DEFAULT '{}',
  PRIMARY KEY (instance_id, name)
);

-- ---- Marketplace -----------------------------------------------------------------

-- An image version registered by a publisher (a tenant). Versions are
-- immutable; a new price is a new version. price_per_hour_micros is charged
-- on top of the GPU rent, split 70:30 between publisher and platform.
CREATE TABLE marketplace_images (
  id                    text PRIMARY KEY,
  publisher_tenant_id   text NOT NULL REFERENCES tenants (id),
  name                  text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
  version               text NOT NULL CHECK (version ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$'),
  image                 text NOT NULL,
  description           text NOT NULL DEFAULT '',
  ports                 integer[] NOT NULL DEFAULT '{}',
  gpu_count             integer NOT NULL CHECK (gpu_count BETWEEN 1 AND 128),
  price_per_hour_micros bigint NOT NULL CHECK (price_per_hour_micros BETWEEN 0 AND 1000000000),
  listed                boolean NOT NULL DEFAULT true,
  request_id            text NOT NULL,
  created_at            timestamptz NOT NULL,
  UNIQUE (name, version),
  UNIQUE (publisher_tenant_id, request_id)
);
CREATE INDEX marketplace_images_publisher ON marketplace_images (publisher_tenant_id);

-- The app an instance runs, with the price and publisher at launch: a later
-- version does not change what a running instance pays.
CREATE TABLE instance_apps (
  instance_id           text PRIMARY KEY REFERENCES instances (id),
  image_id              text NOT NULL REFERENCES marketplace_images (id),
  publisher_tenant_id   text NOT NULL REFERENCES tenants (id),
  price_per_hour_micros bigint NOT NULL CHECK (price_per_hour_micros >= 0)
);

-- App fee minutes the buyer's funds could not pay.
CREATE TABLE app_fee_shortfalls (
  instance_id      text NOT NULL REFERENCES instances (id),
  usage_minute     bigint NOT NULL,
  tenant_id        text NOT NULL REFERENCES tenants (id),
  fee_micros       bigint NOT NULL CHECK (fee_micros > 0),
  charged_micros   bigint NOT NULL CHECK (charged_micros >= 0),
  at               timestamptz NOT NULL,
  PRIMARY KEY (instance_id, usage_minute),
  CHECK (charged_micros < fee_micros)
);

-- Storage minutes the owner's funds could not pay (volumes are not deleted
-- for it; the tenant sees the shortfall).
CREATE TABLE storage_shortfalls (
  volume_id        text NOT NULL REFERENCES volumes (id),
  usage_minute     bigint NOT NULL,
  tenant_id        text NOT NULL REFERENCES tenants (id),
  fee_micros       bigint NOT NULL CHECK (fee_micros > 0),
  charged_micros   bigint NOT NULL CHECK (charged_micros >= 0),
  at               timestamptz NOT NULL,
  PRIMARY KEY (volume_id, usage_minute),
  CHECK (charged_micros < fee_micros)
);

-- Money paid out to a publisher, recorded by an admin; the ledger transfer
-- (kind 'payout', key payout:<reference>) moves it out of the payable.
CREATE TABLE publisher_payouts (
  reference           text PRIMARY KEY,
  publisher_tenant_id text NOT NULL REFERENCES tenants (id),
  amount_micros       bigint NOT NULL CHECK (amount_micros > 0),
  note                text NOT NULL DEFAULT '',
  at                  timestamptz NOT NULL
);
CREATE INDEX publisher_payouts_publisher ON publisher_payouts (publisher_tenant_id, at);

-- New posting kinds: app fees (split to publisher and platform), storage
-- and payouts.
ALTER TABLE ledger_transfers DROP CONSTRAINT ledger_transfers_kind_check;
ALTER TABLE ledger_transfers ADD CONSTRAINT ledger_transfers_kind_check CHECK (kind IN (
  'charge', 'trial_grant', 'trial_expiry', 'topup', 'sla_refund', 'adjustment',
  'app_fee', 'storage', 'payout'));

-- Storage prices per GiB-hour, by volume kind ('*' for any).
INSERT INTO price_book (item_kind, item, unit_price_micros, effective_from, created_at)
VALUES ('storage_gib_hour', 'network', 400, '1970-01-01+00', '1970-01-01+00'),
       ('storage_gib_hour', 'node_local', 200, '1970-01-01+00', '1970-01-01+00'),
       ('storage_gib_hour', '*', 400, '1970-01-01+00', '1970-01-01+00');

-- ---- Port mapping ------------------------------------------------------------------

-- Where the node's published ports are reachable, and the range svd may
-- hand out on it (announced by the agent at registration).
ALTER TABLE nodes
  ADD COLUMN address text NOT NULL DEFAULT '',
  ADD COLUMN node_port_min integer NOT NULL DEFAULT 30000
      CHECK (node_port_min BETWEEN 1024 AND 65535),
  ADD COLUMN node_port_max integer NOT NULL DEFAULT 32767
      CHECK (node_port_max BETWEEN 1024 AND 65535);

-- The ports an instance declares.
CREATE TABLE instance_ports (
  instance_id    text NOT NULL REFERENCES instances (id),
  container_port integer NOT NULL CHECK (container_port BETWEEN 1 AND 65535),
  protocol       text NOT NULL DEFAULT 'tcp' CHECK (protocol IN ('tcp', 'udp')),
  PRIMARY KEY (instance_id, container_port, protocol)
);

-- Node ports handed out. The unique (node_id, node_port) makes a collision
-- impossible whatever races; rows go when the instance leaves its node.
CREATE TABLE node_port_bindings (
  node_id        text NOT NULL REFERENCES nodes (id),
  node_port      integer NOT NULL CHECK (node_port BETWEEN 1 AND 65535),
  instance_id    text NOT NULL REFERENCES instances (id),
  container_port integer NOT NULL,
  protocol       text NOT NULL,
  bound_at       timestamptz NOT NULL,
  PRIMARY KEY (node_id, node_port),
  UNIQUE (instance_id, node_id, container_port, protocol)
);
CREATE INDEX node_port_bindings_instance ON node_port_bindings (instance_id);

-- Completes the moves whose volume has no attachment left: the volume is
-- attached to the target, pending the agents' confirmation when the target
-- holds nodes. A target that ended meanwhile drops the move.
CREATE FUNCTION volumes_complete_moves(now timestamptz) RETURNS void AS $$
BEGIN
  UPDATE volumes v SET move_to_instance_id = NULL, move_mount_path = NULL, updated_at = now
  FROM instances i
  WHERE v.move_to_instance_id = i.id AND i.state IN ('DELETED', 'FAILED');
  WITH ready AS (
    SELECT v.id, v.tenant_id, v.move_to_instance_id AS target, v.move_mount_path AS mount_path
    FROM volumes v
    WHERE v.move_to_instance_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM volume_attachments a WHERE a.volume_id = v.id)
  ), cleared AS (
    UPDATE volumes v SET move_to_instance_id = NULL, move_mount_path = NULL, updated_at = now
    FROM ready r WHERE v.id = r.id
  )
  INSERT INTO volume_attachments (volume_id, instance_id, tenant_id, read_only, mount_path,
                                  state, requested_at, confirmed_at)
  SELECT r.id, r.target, r.tenant_id, false, r.mount_path,
         CASE WHEN i.state IN ('SCHEDULED', 'STARTING', 'RUNNING') THEN 'attaching'
              ELSE 'attached' END,
         now,
         CASE WHEN i.state IN ('SCHEDULED', 'STARTING', 'RUNNING') THEN NULL ELSE now END
  FROM ready r JOIN instances i ON i.id = r.target
  ON CONFLICT DO NOTHING;
END $$ LANGUAGE plpgsql;

-- When an instance leaves its nodes (stopped, deleted, failed, requeued) its
-- node ports are released and its pending attachment changes settle: there
-- is no agent left to confirm them. A deleted instance lets go of its
-- volumes. One trigger covers every path that ends a placement.
CREATE FUNCTION instances_release_node_resources() RETURNS trigger AS $$
BEGIN
  DELETE FROM node_port_bindings WHERE instance_id = NEW.id;
  IF NEW.state = 'DELETED' THEN
    DELETE FROM volume_attachments WHERE instance_id = NEW.id;
  ELSE
    DELETE FROM volume_attachments WHERE instance_id = NEW.id AND state = 'detaching';
    UPDATE volume_attachments SET state = 'attached', confirmed_nodes = '{}',
           confirmed_at = NEW.updated_at
    WHERE instance_id = NEW.id AND state = 'attaching';
  END IF;
  PERFORM volumes_complete_moves(NEW.updated_at);
  RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER instances_release_node_resources
  AFTER UPDATE OF state ON instances
  FOR EACH ROW
  WHEN (OLD.state IS DISTINCT FROM NEW.state
        AND NEW.state IN ('PENDING', 'STOPPING', 'STOPPED', 'DELETED', 'FAILED'))
  EXECUTE FUNCTION instances_release_node_resources();
CREATE INDEX volumes_moving ON volumes (id) WHERE move_to_instance_id IS NOT NULL;
