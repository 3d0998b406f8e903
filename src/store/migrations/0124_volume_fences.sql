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
--
-- Only nodes whose agent sends such heartbeats fence (fences_mounts, set
-- at each registration from RegisterNode.reports_complete_lists): a node
-- with an older agent would never end a fence, so it keeps the old rule.
ALTER TABLE volume_attachments ADD COLUMN fenced_nodes text[] NOT NULL DEFAULT '{}';
CREATE INDEX volume_attachments_fenced ON volume_attachments (instance_id)
  WHERE cardinality(fenced_nodes) > 0;
-- A heartbeat asks for its node's fences: by node, never by a scan.
CREATE INDEX volume_attachments_fenced_nodes ON volume_attachments USING gin (fenced_nodes)
  WHERE cardinality(fenced_nodes) > 0;
ALTER TABLE nodes ADD COLUMN fences_mounts boolean NOT NULL DEFAULT false;

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
            FROM gone_reservations o JOIN nodes n ON n.id = o.node_id AND n.fences_mounts
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
-- fenced attachment into a detaching one instead of dropping it. The nodes
-- the instance still holds are fenced here first: a statement that frees
-- the GPUs and changes the state at once (sv_delete_instances' CTEs) may
-- run this before the reservations' trigger, whose fence then came too
-- late; either order now fences them.
CREATE OR REPLACE FUNCTION instances_release_node_resources() RETURNS trigger AS $$
BEGIN
  UPDATE volume_attachments a
     SET fenced_nodes = ARRAY(SELECT DISTINCT x FROM unnest(a.fenced_nodes || h.nodes) x
                              ORDER BY x)
    FROM (SELECT array_agg(DISTINCT r.node_id) AS nodes
            FROM gpu_reservations r JOIN nodes n ON n.id = r.node_id AND n.fences_mounts
           WHERE r.instance_id = NEW.id) h
   WHERE a.instance_id = NEW.id AND h.nodes IS NOT NULL AND NOT (a.fenced_nodes @> h.nodes);
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
     WHERE cardinality(a.fenced_nodes) > 0 AND a.fenced_nodes @> ARRAY[p_node]
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

-- Migration 0097's batched delete (the API's DeleteInstance), with the
-- GPUs freed before the state changes; otherwise unchanged.
CREATE OR REPLACE FUNCTION sv_delete_instances(p_tenant_ids text[], p_ids text[],
                                               p_nows timestamptz[], p_wait boolean)
RETURNS TABLE (ord integer, verdict text, id text, tenant_id text, name text,
               gpu_count integer, gpu_model text, image text, state text, state_reason text,
               request_id text, created_at timestamptz, updated_at timestamptz,
               request_fingerprint text, max_leaves integer)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
  v_tenants text[];
  v_ids text[];
  v_states text[];
BEGIN
  IF coalesce(array_length(p_ids, 1), 0) = 0 THEN
    RETURN;
  END IF;
  -- With p_wait, first wait for every row asked for, in id order as every
  -- batch locks instances; the statement below then finds them all (SKIP
  -- LOCKED never skips this transaction's own locks), each in its newest
  -- version.
  IF p_wait THEN
    PERFORM 1 FROM instances x
      WHERE x.id = ANY (p_ids)
        AND (x.tenant_id, x.id) IN (SELECT u.t, u.i FROM unnest(p_tenant_ids, p_ids) u(t, i))
      ORDER BY x.id FOR NO KEY UPDATE OF x;
  END IF;
  -- The rows asked for by their own tenant, locked unless held elsewhere.
  SELECT coalesce(array_agg(l.tenant_id), '{}'), coalesce(array_agg(l.id), '{}'),
         coalesce(array_agg(l.state), '{}')
    INTO v_tenants, v_ids, v_states
    FROM (SELECT x.tenant_id, x.id, x.state FROM instances x
          WHERE x.id = ANY (p_ids)
            AND (x.tenant_id, x.id) IN (SELECT u.t, u.i FROM unnest(p_tenant_ids, p_ids) u(t, i))
          FOR NO KEY UPDATE OF x SKIP LOCKED) l;
  -- The GPUs first, in a statement of their own, so that their trigger
  -- fences the nodes on the attachments before the state's trigger
  -- releases them. As a sub-statement of the query below (0097's "freed")
  -- it ran after the update, and the attachments were gone before the
  -- fence. Rows locked DELETED hold no GPUs, so this frees what "freed" did.
  DELETE FROM gpu_reservations r WHERE r.instance_id = ANY (v_ids);
  RETURN QUERY
  WITH e AS (
    SELECT u.n::integer AS n, u.tenant_id, u.id, u.at
    FROM unnest(p_tenant_ids, p_ids, p_nows) WITH ORDINALITY AS u(tenant_id, id, at, n)
  ),
  l AS (
    SELECT u.tenant_id, u.id, u.state FROM unnest(v_tenants, v_ids, v_states)
      AS u(tenant_id, id, state)
  ),
  -- Each element with the state of its row when locked (NULL: not locked)
  -- and whether it is the first element of the batch for that row.
  f AS MATERIALIZED (
    SELECT e.n, e.tenant_id, e.id, e.at, l.state AS locked_state,
           row_number() OVER (PARTITION BY e.tenant_id, e.id ORDER BY e.n) = 1 AS first
    FROM e LEFT JOIN l ON l.tenant_id = e.tenant_id AND l.id = e.id
  ),
  d AS MATERIALIZED (
    SELECT f.n, f.id, f.at, f.locked_state FROM f
    WHERE f.first AND f.locked_state IS NOT NULL AND f.locked_state <> 'DELETED'
  ),
  ev AS (
    INSERT INTO instance_events (instance_id, at, from_state, to_state, reason)
      SELECT d.id, d.at, d.locked_state, 'DELETED', 'deleted by the user' FROM d ORDER BY d.n
  ),
  upd AS (
    UPDATE instances x SET state = 'DELETED', state_reason = 'deleted by the user',
        updated_at = d.at, running_since = NULL
      FROM d WHERE x.id = d.id
      RETURNING x.id, x.tenant_id, x.name, x.gpu_count, x.gpu_model, x.image, x.state,
                x.state_reason, x.request_id, x.created_at, x.updated_at,
                x.request_fingerprint, x.max_leaves
  ),
  -- The rows locked DELETED already, as they are (this statement's
  -- snapshot, before the update above).
  kept AS (
    SELECT x.id, x.tenant_id, x.name, x.gpu_count, x.gpu_model, x.image, x.state,
           x.state_reason, x.request_id, x.created_at, x.updated_at, x.request_fingerprint,
           x.max_leaves
    FROM instances x WHERE x.id IN (SELECT f.id FROM f WHERE f.locked_state = 'DELETED')
  ),
  answered AS (
    SELECT * FROM upd UNION ALL SELECT * FROM kept
  )
  SELECT f.n,
         CASE WHEN f.locked_state IS NULL THEN
                CASE WHEN EXISTS (SELECT 1 FROM instances x
                                  WHERE x.tenant_id = f.tenant_id AND x.id = f.id)
                  THEN 'BUSY' ELSE 'NOT_FOUND' END
              WHEN f.first AND f.locked_state <> 'DELETED' THEN 'DELETED'
              ELSE 'UNCHANGED' END,
         w.id, w.tenant_id, w.name, w.gpu_count, w.gpu_model, w.image, w.state,
         w.state_reason, w.request_id, w.created_at, w.updated_at, w.request_fingerprint,
         w.max_leaves
  FROM f LEFT JOIN answered w ON w.id = f.id AND f.locked_state IS NOT NULL
  ORDER BY f.n;
END
$$;
