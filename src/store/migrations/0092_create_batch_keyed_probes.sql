-- The create batch's probe for tenants that take the element-by-element
-- path (migration 0085) could read the whole instances table once per batch
-- (docs/reliability.md, "Benchmark"). Its two probes, "has this tenant used
-- this request_id" and "has this trial user a grant", were correlated EXISTS
-- under an OR, which PostgreSQL plans both ways and picks between at plan
-- time by the statistics of the moment. In the creates-only benchmark the
-- batch function's generic plan, made when instances was estimated at 2,646
-- rows, had the hashed form: a sequential scan of every instance (9,690
-- rows by then, 451 buffers for a batch of 15) and of every trial grant,
-- per batch, until the next automatic ANALYZE has the function replanned. As LATERAL subqueries with LIMIT 1 they can only be
-- probed per element, through the (tenant_id, request_id) key and the
-- trial_grants primary key. Everything else is migration 0085's function,
-- restated unchanged: the answers do not change.

CREATE OR REPLACE FUNCTION sv_create_instances(
    p_ids text[], p_tenant_ids text[], p_names text[], p_gpu_counts integer[],
    p_gpu_models text[], p_images text[], p_request_ids text[], p_fingerprints text[],
    p_max_leaves integer[], p_nows timestamptz[], p_pending_maxes integer[],
    p_trial_users text[], p_trial_amounts bigint[], p_trial_expires timestamptz[],
    p_credit_minutes integer[], p_cap_since_minutes bigint[], p_active_max integer)
RETURNS TABLE (ord integer, verdict text, existing_id text, used bigint, allowed bigint)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
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
  -- Each element probes the two keys once (LIMIT 1 keeps the lookups
  -- parameterised: see the top of this file).
  SELECT coalesce(array_agg(DISTINCT e.tenant_id), '{}') INTO v_slow
    FROM (SELECT u.tenant_id, u.request_id, u.trial_user, u.pending_max,
                 count(*) OVER (PARTITION BY u.tenant_id, u.request_id) AS same_request,
                 min(u.pending_max) OVER (PARTITION BY u.tenant_id) AS pending_min,
                 max(u.pending_max) OVER (PARTITION BY u.tenant_id) AS pending_max_max
          FROM unnest(p_tenant_ids, p_request_ids, p_trial_users, p_pending_maxes)
               AS u(tenant_id, request_id, trial_user, pending_max)) e
    LEFT JOIN LATERAL (SELECT true AS granted FROM trial_grants g
                       WHERE g.user_id = e.trial_user LIMIT 1) tg ON true
    LEFT JOIN LATERAL (SELECT true AS used FROM instances x
                       WHERE x.tenant_id = e.tenant_id AND x.request_id = e.request_id
                       LIMIT 1) ur ON true
    WHERE e.same_request > 1 OR e.pending_min <> e.pending_max_max
       OR (e.trial_user <> '' AND tg.granted IS NULL)
       OR ur.used IS NOT NULL;

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
    -- Per tenant: its counts and limits as the element-by-element path
    -- reads them (a pending_max < 0 skips the pending quota).
    c AS MATERIALIZED (
      SELECT d.tenant_id, d.pending_max, n.active,
             coalesce(q.instances_max, p_active_max)::bigint AS active_max,
             CASE WHEN d.pending_max >= 0 THEN n.pending END AS pending,
             coalesce(q.pending_count_max, d.pending_max)::bigint AS pending_cap
      FROM (SELECT DISTINCT e.tenant_id, e.pending_max FROM e) d
      CROSS JOIN LATERAL (
        SELECT count(*) AS active, count(*) FILTER (WHERE x.state = 'PENDING') AS pending
        FROM instances x WHERE x.tenant_id = d.tenant_id
          AND x.state NOT IN ('STOPPED', 'DELETED', 'FAILED')) n
      LEFT JOIN tenant_quotas q ON q.tenant_id = d.tenant_id
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
