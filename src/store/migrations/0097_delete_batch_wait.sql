-- The delete batch's rows that another transaction held, deleted together
-- (issue 9, docs/reliability.md, "Fewer signals, busy deletes in one batch").
--
-- sv_delete_instances (0086) locks the rows no other transaction holds
-- (SKIP LOCKED) and answers BUSY for the rest; svd then deleted each of those
-- alone, in a transaction of its own that waited for the row, with its audit
-- row written apart. Since the desired-set signal (0094), a node's read
-- moves a placed instance to STARTING right after the placement commits,
-- which is when a client that deletes at once sends its delete: in the
-- benchmark's create-and-delete mode 21% of the deletes were BUSY, each
-- waiting 6.3 ms on average for its row, alone.
--
-- With p_wait the function waits for every row of the batch instead, locking
-- them in id order, so svd deletes a batch's busy rows in one more batch
-- (one transaction, the audit rows in it). The three-argument form is kept
-- for replicas of an older svd during a rolling upgrade.

CREATE FUNCTION sv_delete_instances(p_tenant_ids text[], p_ids text[],
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
  freed AS (
    DELETE FROM gpu_reservations r USING d WHERE r.instance_id = d.id
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

CREATE OR REPLACE FUNCTION sv_delete_instances(p_tenant_ids text[], p_ids text[],
                                               p_nows timestamptz[])
RETURNS TABLE (ord integer, verdict text, id text, tenant_id text, name text,
               gpu_count integer, gpu_model text, image text, state text, state_reason text,
               request_id text, created_at timestamptz, updated_at timestamptz,
               request_fingerprint text, max_leaves integer)
LANGUAGE sql VOLATILE AS $$
  SELECT * FROM sv_delete_instances(p_tenant_ids, p_ids, p_nows, false)
$$;
