-- SSH public keys of a tenant (docs/security.md, "SSH keys"). The node
-- agents keep every key of an instance's tenant in the instance's
-- /root/.ssh/authorized_keys, so a key added or deleted here changes the
-- desired set of every node that holds one of the tenant's instances: the
-- trigger signals those nodes (migration 0094's sv_node_desired).
CREATE TABLE ssh_keys (
  id text PRIMARY KEY,
  tenant_id text NOT NULL REFERENCES tenants(id),
  name text NOT NULL CHECK (name ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
  public_key text NOT NULL CHECK (length(public_key) <= 16384),
  fingerprint text NOT NULL,
  created_by text NOT NULL,
  created_at timestamptz NOT NULL,
  UNIQUE (tenant_id, name),
  UNIQUE (tenant_id, fingerprint)
);

CREATE FUNCTION sv_desired_ssh_keys_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    PERFORM pg_notify('sv_node_desired', n.node_id)
      FROM (SELECT DISTINCT r.node_id FROM gpu_reservations r
            JOIN instances i ON i.id = r.instance_id
            WHERE i.tenant_id IN (SELECT tenant_id FROM new_rows)) n;
  ELSE
    PERFORM pg_notify('sv_node_desired', n.node_id)
      FROM (SELECT DISTINCT r.node_id FROM gpu_reservations r
            JOIN instances i ON i.id = r.instance_id
            WHERE i.tenant_id IN (SELECT tenant_id FROM old_rows)) n;
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER ssh_keys_desired_insert AFTER INSERT ON ssh_keys
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sv_desired_ssh_keys_changed();
CREATE TRIGGER ssh_keys_desired_delete AFTER DELETE ON ssh_keys
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sv_desired_ssh_keys_changed();
