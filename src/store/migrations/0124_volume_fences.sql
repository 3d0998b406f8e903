-- A volume may still be mounted on a node its instance has left, until that
-- node says the instance has no process there. Until 2026-12-08 an
-- instance's attachments were let go the moment it left a node (a stop, a
-- delete, the node going down, a gang shrinking): a node cut off from svd
-- but alive kept the tenant's job writing to a network volume while the
-- tenant, told the instance had stopped, detached the volume and attached
-- it for writing to an instance elsewhere. Two writers on one file system.
--
-- fenced_nodes lists the nodes the attachment's instance left that have
-- not said so yet: a heartbeat whose complete lists (running and desired)
-- lack the instance ends the fence of that node (volume_attachments_unfence),
-- and so does an operator's ForgetNodeMounts for a down node that will not
-- return. While it is not empty the row stays: a detach, a move or the
-- instance's delete leaves it 'detaching', so the volume cannot be attached
-- elsewhere (one writer) or deleted; and the queue holds back a start of
-- the instance while a volume it writes is fenced (scheduling_store.cc).
ALTER TABLE volume_attachments ADD COLUMN fenced_nodes text[] NOT NULL DEFAULT '{}';
CREATE INDEX volume_attachments_fenced ON volume_attachments (instance_id)
  WHERE cardinality(fenced_nodes) > 0;

-- Why a fenced attachment waits, naming the nodes.
CREATE FUNCTION volume_fence_reason(p_nodes text[]) RETURNS text
LANGUAGE sql STABLE AS $$
  SELECT 'waiting for node ' || coalesce(string_agg(n.name, ', ' ORDER BY n.name), '?') ||
         ' to confirm the instance no longer runs there (it left the node while the ' ||
         'volume was mounted)'
  FROM nodes n WHERE n.id = ANY(p_nodes)
$$;

-- Reservations that went: each node the instance holds no GPU of any more
-- is fenced on every attachment of the instance. Statement-level, so a gang
-- that leaves several nodes at once has them all recorded.
CREATE FUNCTION gpu_reservations_fence_left_nodes() RETURNS trigger AS $$
BEGIN
  UPDATE volume_attachments a
     SET fenced_nodes = ARRAY(SELECT DISTINCT x FROM unnest(a.fenced_nodes || g.nodes) x
                              ORDER BY x)
    FROM (SELECT o.instance_id, array_agg(DISTINCT o.node_id) AS nodes
            FROM gone_reservations o
           WHERE NOT EXISTS (SELECT 1 FROM gpu_reservations r
                              WHERE r.instance_id = o.instance_id AND r.node_id = o.node_id)
           GROUP BY o.instance_id) g
   WHERE a.instance_id = g.instance_id AND NOT (a.fenced_nodes @> g.nodes);
  RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER gpu_reservations_fence_left_nodes
  AFTER DELETE ON gpu_reservations
  REFERENCING OLD TABLE AS gone_reservations
  FOR EACH STATEMENT EXECUTE FUNCTION gpu_reservations_fence_left_nodes();

-- An instance that holds a node again owns what it mounts there: its agent
-- replaces any process of an earlier run, and svd counts the node's mount
-- reports for it again. Only rows with a fence are looked at (the index).
CREATE FUNCTION gpu_reservations_unfence_held_nodes() RETURNS trigger AS $$
BEGIN
  UPDATE volume_attachments a
     SET fenced_nodes = ARRAY(SELECT x FROM unnest(a.fenced_nodes) x WHERE x <> ALL (g.nodes))
    FROM (SELECT n.instance_id, array_agg(DISTINCT n.node_id) AS nodes
            FROM new_reservations n GROUP BY n.instance_id) g
   WHERE a.instance_id = g.instance_id AND cardinality(a.fenced_nodes) > 0
     AND a.fenced_nodes && g.nodes;
  RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER gpu_reservations_unfence_held_nodes
  AFTER INSERT ON gpu_reservations
  REFERENCING NEW TABLE AS new_reservations
  FOR EACH STATEMENT EXECUTE FUNCTION gpu_reservations_unfence_held_nodes();

-- Migration 0052's release, keeping fenced rows: a stop drops a detaching
-- attachment only when no node may still mount it, and a delete turns a
-- fenced attachment into a detaching one instead of dropping it (the
-- reservations are deleted before the state changes, so the fence is set).
CREATE OR REPLACE FUNCTION instances_release_node_resources() RETURNS trigger AS $$
BEGIN
  DELETE FROM node_port_bindings WHERE instance_id = NEW.id;
  IF NEW.state = 'DELETED' THEN
    DELETE FROM volume_attachments
     WHERE instance_id = NEW.id AND cardinality(fenced_nodes) = 0;
    UPDATE volume_attachments SET state = 'detaching', confirmed_nodes = '{}',
           requested_at = NEW.updated_at, reason = volume_fence_reason(fenced_nodes)
     WHERE instance_id = NEW.id;
  ELSE
    DELETE FROM volume_attachments
     WHERE instance_id = NEW.id AND state = 'detaching' AND cardinality(fenced_nodes) = 0;
    UPDATE volume_attachments SET state = 'attached', confirmed_nodes = '{}',
           confirmed_at = NEW.updated_at
    WHERE instance_id = NEW.id AND state = 'attaching';
  END IF;
  IF EXISTS (SELECT 1 FROM volumes WHERE move_to_instance_id IS NOT NULL) THEN
    PERFORM volumes_complete_moves(NEW.updated_at);
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;

-- Ends the fences of node p_node on the attachments of every instance not
-- in p_listed (what the node runs or is told to run), then what waited for
-- them: a detach whose instance holds no node that has not confirmed it,
-- and the moves such a detach held. Returns how many attachments it freed
-- of the fence. p_listed NULL: every instance (the operator's override).
CREATE FUNCTION volume_attachments_unfence(p_node text, p_listed text[], p_now timestamptz)
RETURNS integer AS $$
DECLARE
  v_instances text[];
  v_count integer;
BEGIN
  WITH cleared AS (
    UPDATE volume_attachments a SET fenced_nodes = array_remove(a.fenced_nodes, p_node)
     WHERE cardinality(a.fenced_nodes) > 0 AND p_node = ANY (a.fenced_nodes)
       AND (p_listed IS NULL OR NOT (a.instance_id = ANY (p_listed)))
    RETURNING a.instance_id)
  SELECT array_agg(DISTINCT instance_id), count(*) INTO v_instances, v_count FROM cleared;
  IF v_count = 0 THEN
    RETURN 0;
  END IF;
  DELETE FROM volume_attachments a
   WHERE a.instance_id = ANY (v_instances) AND a.state = 'detaching'
     AND cardinality(a.fenced_nodes) = 0
     AND NOT EXISTS (SELECT 1 FROM gpu_reservations r WHERE r.instance_id = a.instance_id
                     AND NOT (r.node_id = ANY (a.confirmed_nodes)));
  UPDATE volume_attachments a SET reason = CASE WHEN cardinality(a.fenced_nodes) = 0 THEN ''
                                                ELSE volume_fence_reason(a.fenced_nodes) END
   WHERE a.instance_id = ANY (v_instances) AND a.reason LIKE 'waiting for node % to confirm%';
  PERFORM volumes_complete_moves(p_now);
  RETURN v_count;
END $$ LANGUAGE plpgsql;
