-- A signal for each node whose desired instance set may have changed, so
-- that svd need not read every node's set twice a second to find out
-- (issue 9, docs/agent.md, "Desired-set signal").
--
-- svd sends an agent the set of instances its node should run
-- (AgentStore::DesiredForNode). It used to read that set for every open
-- agent stream every 500 ms, changed or not: two transactions a node each
-- time (the set, then the unsent detaches), 256 a second for 64 nodes and
-- 4,000 a second for 1,000, most of them finding nothing new.
--
-- Now every write that can change what DesiredForNode answers for a node
-- sends NOTIFY sv_node_desired with that node's id as the payload. Every
-- svd LISTENs; the one holding the node's stream reads the set at once.
-- While the LISTEN connection is down svd polls as before, and while it is
-- up it still reads each set at a slow backstop interval, so a signal
-- missed by a path not listed here delays a change, never loses it.
--
-- NOTIFY is transactional: it is delivered at COMMIT, and never for a
-- rolled-back change. Signals with the same payload in one transaction are
-- delivered once.
--
-- What changes a node's set, and the trigger that signals it:
-- - its reservations, inserted or deleted (placements, ends, resizes);
-- - the state of an instance holding GPUs on it, into or out of the
--   holding states or between them (SCHEDULED -> STARTING excepted: the
--   agent sees both as "not yet confirmed", and DesiredForNode itself makes
--   that move, so signalling it would only read the set again);
-- - the node's own state (down ends the stream);
-- - an instance's volume attachments (added, removed, or their state, path
--   or mode changed), library mounts and requested ports;
-- - a volume's kind or node (a node-local volume mounts only on its node);
-- - a port binding removed.

CREATE FUNCTION sv_notify_instance_nodes(p_instance_id text) RETURNS void
LANGUAGE sql AS $$
  SELECT pg_notify('sv_node_desired', r.node_id)
  FROM (SELECT DISTINCT node_id FROM gpu_reservations WHERE instance_id = p_instance_id) r;
$$;

-- Reservations, a statement at a time (a placement inserts a gang's rows
-- in one statement).
CREATE FUNCTION sv_desired_reservations_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    PERFORM pg_notify('sv_node_desired', n.node_id)
      FROM (SELECT DISTINCT node_id FROM new_rows) n;
  ELSIF TG_OP = 'DELETE' THEN
    PERFORM pg_notify('sv_node_desired', n.node_id)
      FROM (SELECT DISTINCT node_id FROM old_rows) n;
  ELSE
    PERFORM pg_notify('sv_node_desired', n.node_id)
      FROM (SELECT node_id FROM old_rows UNION SELECT node_id FROM new_rows) n;
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER gpu_reservations_desired_insert AFTER INSERT ON gpu_reservations
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sv_desired_reservations_changed();
CREATE TRIGGER gpu_reservations_desired_delete AFTER DELETE ON gpu_reservations
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sv_desired_reservations_changed();
CREATE TRIGGER gpu_reservations_desired_update AFTER UPDATE ON gpu_reservations
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sv_desired_reservations_changed();

-- Rows of tables keyed by instance: the nodes that instance holds.
CREATE FUNCTION sv_desired_instance_row_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP IN ('UPDATE', 'DELETE') THEN
    PERFORM sv_notify_instance_nodes(OLD.instance_id);
  END IF;
  IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.instance_id <> OLD.instance_id) THEN
    PERFORM sv_notify_instance_nodes(NEW.instance_id);
  END IF;
  RETURN NULL;
END
$$;

-- An instance's own state. The WHEN clause keeps every other update (the
-- queue's reasons and positions, PENDING -> DELETED) free of the call.
CREATE FUNCTION sv_desired_instance_state_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM sv_notify_instance_nodes(NEW.id);
  RETURN NULL;
END
$$;

CREATE TRIGGER instances_desired_state AFTER UPDATE OF state ON instances
  FOR EACH ROW
  WHEN (OLD.state IS DISTINCT FROM NEW.state
        AND (OLD.state IN ('SCHEDULED', 'STARTING', 'RUNNING', 'STOPPING')
             OR NEW.state IN ('SCHEDULED', 'STARTING', 'RUNNING', 'STOPPING'))
        AND NOT (OLD.state = 'SCHEDULED' AND NEW.state = 'STARTING'))
  EXECUTE FUNCTION sv_desired_instance_state_changed();

CREATE FUNCTION sv_desired_node_state_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('sv_node_desired', NEW.id);
  RETURN NULL;
END
$$;

CREATE TRIGGER nodes_desired_state AFTER UPDATE OF state ON nodes
  FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
  EXECUTE FUNCTION sv_desired_node_state_changed();

CREATE TRIGGER volume_attachments_desired_insert_delete
  AFTER INSERT OR DELETE ON volume_attachments
  FOR EACH ROW EXECUTE FUNCTION sv_desired_instance_row_changed();
-- confirmed_nodes and reason are svd's bookkeeping, not the agent's.
CREATE TRIGGER volume_attachments_desired_update AFTER UPDATE ON volume_attachments
  FOR EACH ROW
  WHEN (OLD.state IS DISTINCT FROM NEW.state
        OR OLD.mount_path IS DISTINCT FROM NEW.mount_path
        OR OLD.read_only IS DISTINCT FROM NEW.read_only
        OR OLD.volume_id IS DISTINCT FROM NEW.volume_id
        OR OLD.instance_id IS DISTINCT FROM NEW.instance_id)
  EXECUTE FUNCTION sv_desired_instance_row_changed();

CREATE TRIGGER instance_library_mounts_desired AFTER INSERT OR DELETE ON instance_library_mounts
  FOR EACH ROW EXECUTE FUNCTION sv_desired_instance_row_changed();
CREATE TRIGGER instance_ports_desired AFTER INSERT OR DELETE ON instance_ports
  FOR EACH ROW EXECUTE FUNCTION sv_desired_instance_row_changed();

-- A volume: the nodes of the instances it is attached to.
CREATE FUNCTION sv_desired_volume_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM sv_notify_instance_nodes(a.instance_id)
    FROM volume_attachments a WHERE a.volume_id = NEW.id;
  RETURN NULL;
END
$$;

CREATE TRIGGER volumes_desired AFTER UPDATE OF kind, node_id ON volumes
  FOR EACH ROW
  WHEN (OLD.kind IS DISTINCT FROM NEW.kind OR OLD.node_id IS DISTINCT FROM NEW.node_id)
  EXECUTE FUNCTION sv_desired_volume_changed();

CREATE FUNCTION sv_desired_binding_removed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('sv_node_desired', OLD.node_id);
  RETURN NULL;
END
$$;

CREATE TRIGGER node_port_bindings_desired AFTER DELETE ON node_port_bindings
  FOR EACH ROW EXECUTE FUNCTION sv_desired_binding_removed();
