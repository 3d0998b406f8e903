-- Upper bounds of each tenant's unfinished and PENDING instances, so that a
-- create need not count them (issue 9, docs/reliability.md, "Upper bounds
-- instead of counts").
--
-- The create batch checked the instance limit and the pending quota by
-- counting the tenant's unfinished rows on every batch. Those rows are
-- scattered over the heap, one page each, so the count grew with the
-- tenant's backlog: 340 rows a tenant cost 0.46 ms, 85% of the batch
-- statement, in a creates-only run.
--
-- tenant_instance_bounds holds, per tenant, numbers that are never below
-- the tenant's true counts. The triggers below raise them in the same
-- transaction as every write that can raise a count (an inserted row, or a
-- row moving into an unfinished state or into PENDING); nothing lowers
-- them, since a count that falls leaves a bound still a bound. A batch
-- whose elements all fit under the bounds accepts them without counting;
-- one that might not fit counts exactly, as before, and resets the bounds
-- to the counts. A churning tenant therefore pays one count per
-- (limit - backlog) creates, and a tenant at its limit one per batch, as
-- before.
--
-- The bounds change only under the tenant's row lock (the triggers take
-- it; the create batch holds it), so a batch that reads them after its
-- lock sees every raise committed before it and none can slip in after.
-- No row means not known: the next batch counts and writes one.

CREATE TABLE tenant_instance_bounds (
  tenant_id  text PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
  unfinished bigint NOT NULL CHECK (unfinished >= 0),
  pending    bigint NOT NULL CHECK (pending >= 0)
);

-- Inserted rows, once per statement: a create batch's insert, or the
-- element-by-element path's.
CREATE FUNCTION instances_raise_bounds_on_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM 1 FROM tenants t WHERE t.id IN (SELECT n.tenant_id FROM new_rows n)
    ORDER BY t.id COLLATE "C" FOR UPDATE;
  UPDATE tenant_instance_bounds b
     SET unfinished = b.unfinished + n.unfinished, pending = b.pending + n.pending
    FROM (SELECT r.tenant_id,
                 count(*) FILTER (WHERE r.state NOT IN ('STOPPED', 'DELETED', 'FAILED'))
                   AS unfinished,
                 count(*) FILTER (WHERE r.state = 'PENDING') AS pending
          FROM new_rows r GROUP BY r.tenant_id) n
   WHERE b.tenant_id = n.tenant_id;
  RETURN NULL;
END
$$;

CREATE TRIGGER instances_raise_bounds_insert AFTER INSERT ON instances
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION instances_raise_bounds_on_insert();

-- A row that comes back to life (a stopped instance started again) or
-- back into the queue. The WHEN clause keeps every other update, the
-- placements and the ends, free of the trigger.
CREATE FUNCTION instances_raise_bounds_on_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM 1 FROM tenants t WHERE t.id = NEW.tenant_id FOR UPDATE;
  IF NEW.tenant_id <> OLD.tenant_id THEN
    -- No path moves an instance between tenants; if one ever does, the new
    -- tenant's bounds are forgotten and its next create counts.
    DELETE FROM tenant_instance_bounds b WHERE b.tenant_id = NEW.tenant_id;
    RETURN NULL;
  END IF;
  UPDATE tenant_instance_bounds b
     SET unfinished = b.unfinished +
           CASE WHEN OLD.state IN ('STOPPED', 'DELETED', 'FAILED')
                 AND NEW.state NOT IN ('STOPPED', 'DELETED', 'FAILED') THEN 1 ELSE 0 END,
         pending = b.pending +
           CASE WHEN NEW.state = 'PENDING' AND OLD.state <> 'PENDING' THEN 1 ELSE 0 END
   WHERE b.tenant_id = NEW.tenant_id;
  RETURN NULL;
END
$$;

CREATE TRIGGER instances_raise_bounds_update AFTER UPDATE OF state, tenant_id ON instances
  FOR EACH ROW
  WHEN ((OLD.state IN ('STOPPED', 'DELETED', 'FAILED')
         AND NEW.state NOT IN ('STOPPED', 'DELETED', 'FAILED'))
        OR (NEW.state = 'PENDING' AND OLD.state <> 'PENDING')
        OR NEW.tenant_id <> OLD.tenant_id)
  EXECUTE FUNCTION instances_raise_bounds_on_update();

-- The create batch of migration 0085, with the bounds above in place of
-- the per-tenant counts, and with the two probes that pick the tenants for
-- the element-by-element path kept to their keys: the function's generic
-- plans are made once per connection, in a new database on a nearly empty
-- table, and a fifth of the connections of a creates-only run had planned
-- the request_id check as a hash over a sequential scan of every instance
-- (7 ms a batch at 5,000 rows, growing with the table). OFFSET 0 keeps each
-- EXISTS a probe per element (no hashed alternative) and enable_seqscan =
-- off keeps the probe on an index; every statement here selects by a key or
-- a tenant. Everything else, including the element-by-element path (which
-- counts exactly, as before), is unchanged.
CREATE OR REPLACE FUNCTION sv_create_instances(
    p_ids text[], p_tenant_ids text[], p_names text[], p_gpu_counts integer[],
    p_gpu_models text[], p_images text[], p_request_ids text[], p_fingerprints text[],
    p_max_leaves integer[], p_nows timestamptz[], p_pending_maxes integer[],
    p_trial_users text[], p_trial_amounts bigint[], p_trial_expires timestamptz[],
    p_credit_minutes integer[], p_cap_since_minutes bigint[], p_active_max integer)
RETURNS TABLE (ord integer, verdict text, existing_id text, used bigint, allowed bigint)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan
  SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
  i integer;
  v_slow text[];
  v_tenant text;
  v_fingerprint text;
  v_verdict text;
  v_existing text;
  v_used bigint;
  v_allowed bigint;
BEGIN
  IF coalesce(array_length(p_ids, 1), 0) = 0 THEN
    RETURN;
  END IF;
  PERFORM 1 FROM tenants t WHERE t.id = ANY (p_tenant_ids)
    ORDER BY t.id COLLATE "C" FOR UPDATE;
  -- The tenants that take the element-by-element path (see the top).
  SELECT coalesce(array_agg(DISTINCT e.tenant_id), '{}') INTO v_slow
    FROM (SELECT u.tenant_id, u.request_id, u.trial_user, u.pending_max,
                 count(*) OVER (PARTITION BY u.tenant_id, u.request_id) AS same_request,
                 min(u.pending_max) OVER (PARTITION BY u.tenant_id) AS pending_min,
                 max(u.pending_max) OVER (PARTITION BY u.tenant_id) AS pending_max_max
          FROM unnest(p_tenant_ids, p_request_ids, p_trial_users, p_pending_maxes)
               AS u(tenant_id, request_id, trial_user, pending_max)) e
    WHERE e.same_request > 1 OR e.pending_min <> e.pending_max_max
       OR (e.trial_user <> '' AND NOT EXISTS (
             SELECT 1 FROM trial_grants g WHERE g.user_id = e.trial_user OFFSET 0))
       OR EXISTS (SELECT 1 FROM instances x
                  WHERE x.tenant_id = e.tenant_id AND x.request_id = e.request_id OFFSET 0);

  -- Every other tenant's elements: judged and written in one statement.
  IF coalesce(array_length(v_slow, 1), 0) < array_length(p_ids, 1) THEN
    RETURN QUERY
    WITH e AS (
      SELECT u.n::integer AS n, u.id, u.tenant_id, u.name, u.gpu_count, u.gpu_model, u.image,
             u.request_id, u.fingerprint, u.max_leaves, u.at, u.pending_max
      FROM unnest(p_ids, p_tenant_ids, p_names, p_gpu_counts, p_gpu_models, p_images,
                  p_request_ids, p_fingerprints, p_max_leaves, p_nows, p_pending_maxes)
           WITH ORDINALITY AS u(id, tenant_id, name, gpu_count, gpu_model, image, request_id,
                                fingerprint, max_leaves, at, pending_max, n)
      WHERE u.tenant_id <> ALL (v_slow)
    ),
    -- Per tenant: its limits, and whether its bounds leave room for all of
    -- its elements (then nothing is counted: "fast"). A pending_max < 0
    -- skips the pending quota.
    l AS MATERIALIZED (
      SELECT d.tenant_id, d.pending_max,
             coalesce(q.instances_max, p_active_max)::bigint AS active_max,
             coalesce(q.pending_count_max, d.pending_max)::bigint AS pending_cap,
             b.unfinished AS bound_active, b.pending AS bound_pending,
             coalesce(b.unfinished + d.k <= coalesce(q.instances_max, p_active_max)
                      AND (d.pending_max < 0 OR
                           b.pending + d.k <= coalesce(q.pending_count_max, d.pending_max)),
                      false) AS fast
      FROM (SELECT e.tenant_id, e.pending_max, count(*) AS k
            FROM e GROUP BY e.tenant_id, e.pending_max) d
      LEFT JOIN tenant_quotas q ON q.tenant_id = d.tenant_id
      LEFT JOIN tenant_instance_bounds b ON b.tenant_id = d.tenant_id
    ),
    -- Its counts as the element-by-element path reads them, only where the
    -- bounds do not settle it (the scan is skipped for a fast tenant); for
    -- a fast one its bounds stand in, which leave every element room.
    c AS MATERIALIZED (
      SELECT l.tenant_id, l.pending_max, l.active_max, l.pending_cap, l.fast,
             n.active AS counted_active, n.pending AS counted_pending,
             CASE WHEN l.fast THEN l.bound_active ELSE n.active END AS active,
             CASE WHEN l.pending_max >= 0
               THEN CASE WHEN l.fast THEN l.bound_pending ELSE n.pending END END AS pending
      FROM l CROSS JOIN LATERAL (
        SELECT count(*) AS active, count(*) FILTER (WHERE x.state = 'PENDING') AS pending
        FROM instances x WHERE NOT l.fast AND x.tenant_id = l.tenant_id
          AND x.state NOT IN ('STOPPED', 'DELETED', 'FAILED')) n
    ),
    -- A counted tenant's bounds become its counts; the insert's trigger
    -- then adds what this batch accepts.
    rb AS (
      INSERT INTO tenant_instance_bounds AS b (tenant_id, unfinished, pending)
        SELECT c.tenant_id, c.counted_active, c.counted_pending FROM c WHERE NOT c.fast
      ON CONFLICT (tenant_id) DO UPDATE
        SET unfinished = EXCLUDED.unfinished, pending = EXCLUDED.pending
    ),
    g AS (
      SELECT g.ord, g.verdict, g.used, g.allowed
      FROM sv_create_gates(p_tenant_ids, p_gpu_counts, p_gpu_models, p_nows,
                           p_credit_minutes, p_cap_since_minutes) g
    ),
    -- passed: the element's rank among its tenant's elements that pass the
    -- gate; accepted: how many of those the limits let in. (A data-modifying
    -- WITH runs to completion whether or not the query reads it.)
    r AS MATERIALIZED (
      SELECT e.*, g.verdict AS gate, g.used AS gate_used, g.allowed AS gate_allowed,
             c.active, c.active_max, c.pending, c.pending_cap,
             count(*) FILTER (WHERE g.verdict = 'OK')
               OVER (PARTITION BY e.tenant_id ORDER BY e.n ROWS UNBOUNDED PRECEDING) AS passed,
             least(count(*) FILTER (WHERE g.verdict = 'OK') OVER (PARTITION BY e.tenant_id),
                   greatest(c.active_max - c.active, 0),
                   CASE WHEN c.pending_max >= 0
                     THEN greatest(c.pending_cap - c.pending, 0) END) AS accepted
      FROM e JOIN g ON g.ord = e.n JOIN c ON c.tenant_id = e.tenant_id
    ),
    v AS (
      SELECT r.*,
             CASE WHEN r.gate <> 'OK' THEN r.gate
                  WHEN r.passed <= r.accepted THEN 'CREATED'
                  WHEN r.active + r.accepted >= r.active_max THEN 'INSTANCE_LIMIT_REACHED'
                  ELSE 'QUOTA_EXCEEDED' END AS verdict
      FROM r
    ),
    ins AS (
      INSERT INTO instances (id, tenant_id, name, gpu_count, gpu_model, image, state,
                             state_reason, request_id, request_fingerprint, created_at,
                             updated_at, max_leaves)
        SELECT v.id, v.tenant_id, v.name, v.gpu_count, v.gpu_model, v.image, 'PENDING',
               'waiting for placement', v.request_id, v.fingerprint, v.at, v.at, v.max_leaves
        FROM v WHERE v.verdict = 'CREATED' ORDER BY v.n
    ),
    ev AS (
      INSERT INTO instance_events (instance_id, at, from_state, to_state, reason)
        SELECT v.id, v.at, NULL, 'PENDING', 'instance accepted'
        FROM v WHERE v.verdict = 'CREATED' ORDER BY v.n
    )
    SELECT v.n, v.verdict, NULL::text,
           CASE v.verdict WHEN 'CREATED' THEN NULL
                          WHEN 'INSTANCE_LIMIT_REACHED' THEN v.active + v.accepted
                          WHEN 'QUOTA_EXCEEDED' THEN v.pending + v.accepted
                          ELSE v.gate_used END,
           CASE v.verdict WHEN 'CREATED' THEN NULL
                          WHEN 'INSTANCE_LIMIT_REACHED' THEN v.active_max
                          WHEN 'QUOTA_EXCEEDED' THEN v.pending_cap
                          ELSE v.gate_allowed END
    FROM v ORDER BY v.n;
  END IF;

  IF coalesce(array_length(v_slow, 1), 0) = 0 THEN
    RETURN;
  END IF;
  -- The element-by-element path of migration 0071, for the tenants above.
  FOR i IN 1 .. array_length(p_ids, 1) LOOP
    v_tenant := p_tenant_ids[i];
    CONTINUE WHEN v_tenant <> ALL (v_slow);
    ord := i;
    verdict := NULL;
    existing_id := NULL;
    used := NULL;
    allowed := NULL;
    IF p_trial_users[i] <> '' AND NOT EXISTS (
        SELECT 1 FROM trial_grants g WHERE g.user_id = p_trial_users[i]) THEN
      PERFORM sv_grant_trial(p_trial_users[i], p_trial_amounts[i], p_nows[i],
                             p_trial_expires[i]);
    END IF;
    SELECT x.id, x.request_fingerprint INTO v_existing, v_fingerprint FROM instances x
      WHERE x.tenant_id = v_tenant AND x.request_id = p_request_ids[i];
    IF FOUND THEN
      existing_id := v_existing;
      verdict := CASE WHEN v_fingerprint = p_fingerprints[i] THEN 'EXISTS' ELSE 'REUSED' END;
      RETURN NEXT;
      CONTINUE;
    END IF;
    SELECT g.verdict, g.used, g.allowed INTO v_verdict, v_used, v_allowed
      FROM sv_create_gates(ARRAY[v_tenant], ARRAY[p_gpu_counts[i]], ARRAY[p_gpu_models[i]],
                           ARRAY[p_nows[i]], ARRAY[p_credit_minutes[i]],
                           ARRAY[p_cap_since_minutes[i]]) g;
    IF v_verdict <> 'OK' THEN
      verdict := v_verdict;
      used := v_used;
      allowed := v_allowed;
      RETURN NEXT;
      CONTINUE;
    END IF;
    SELECT count(*) INTO v_used FROM instances x
      WHERE x.tenant_id = v_tenant AND x.state NOT IN ('STOPPED', 'DELETED', 'FAILED');
    v_allowed := coalesce((SELECT q.instances_max FROM tenant_quotas q
                           WHERE q.tenant_id = v_tenant), p_active_max);
    IF v_used >= v_allowed THEN
      verdict := 'INSTANCE_LIMIT_REACHED';
      used := v_used;
      allowed := v_allowed;
      RETURN NEXT;
      CONTINUE;
    END IF;
    IF p_pending_maxes[i] >= 0 THEN
      SELECT count(*) INTO v_used FROM instances x
        WHERE x.tenant_id = v_tenant AND x.state = 'PENDING';
      v_allowed := coalesce((SELECT q.pending_count_max FROM tenant_quotas q
                             WHERE q.tenant_id = v_tenant), p_pending_maxes[i]);
      IF v_used >= v_allowed THEN
        verdict := 'QUOTA_EXCEEDED';
        used := v_used;
        allowed := v_allowed;
        RETURN NEXT;
        CONTINUE;
      END IF;
    END IF;
    INSERT INTO instances (id, tenant_id, name, gpu_count, gpu_model, image, state,
                           state_reason, request_id, request_fingerprint, created_at,
                           updated_at, max_leaves)
      VALUES (p_ids[i], v_tenant, p_names[i], p_gpu_counts[i], p_gpu_models[i], p_images[i],
              'PENDING', 'waiting for placement', p_request_ids[i], p_fingerprints[i],
              p_nows[i], p_nows[i], p_max_leaves[i]);
    INSERT INTO instance_events (instance_id, at, from_state, to_state, reason)
      VALUES (p_ids[i], p_nows[i], NULL, 'PENDING', 'instance accepted');
    verdict := 'CREATED';
    RETURN NEXT;
  END LOOP;
END
$$;
