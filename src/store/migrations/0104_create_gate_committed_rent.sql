-- The create gate counts what the tenant has already committed to
-- (docs/billing.md, "Running out of credit").
--
-- It asked only that the credit cover the first minutes of the new
-- instance, against a balance that metering lowers a minute later. So ten
-- concurrent or quick creates of a tenant with credit for one each passed,
-- and ran (or queued, to run when placed) until the early stop caught up
-- with them; unpaid minutes are the platform's loss, and the GPUs were
-- kept from tenants who pay. Now an element needs credit for the first
-- minutes of itself and of every instance of the tenant that is not ended
-- (PENDING to STOPPING: queued ones bill as soon as they are placed), at
-- today's prices, and of the same tenant's creates accepted before it in
-- the same batch.
--
-- The instances are summed only when the gate is on (credit minutes > 0),
-- once per tenant and gate, over the partial index of unfinished
-- instances; with the gate off (the e2e benchmark) nothing changes.

-- Rent per minute of a tenant's unfinished instances at `p_at`, without
-- the instance `p_exclude` (one being resized, '' for none).
CREATE FUNCTION sv_committed_rent(p_tenant_id text, p_at timestamptz, p_exclude text)
RETURNS bigint LANGUAGE sql STABLE AS $$
  SELECT coalesce(sum(x.gpus * coalesce(
           (SELECT p.unit_price_micros FROM price_book p
            WHERE p.item_kind = 'gpu_minute' AND p.item IN (x.gpu_model, '*')
              AND p.effective_from <= p_at
            ORDER BY (p.item = '*'), p.effective_from DESC LIMIT 1), 0)), 0)::bigint
  FROM (SELECT i.gpu_model, sum(i.gpu_count) AS gpus FROM instances i
        WHERE i.tenant_id = p_tenant_id AND i.state NOT IN ('STOPPED', 'DELETED', 'FAILED')
          AND i.id <> p_exclude
        GROUP BY i.gpu_model) x
$$;

-- As in 0091, with the committed rent (t.committed) in what an element
-- needs.
CREATE OR REPLACE FUNCTION sv_create_gates(p_tenant_ids text[], p_gpu_counts integer[],
                                p_gpu_models text[], p_nows timestamptz[],
                                p_credit_minutes integer[], p_cap_since_minutes bigint[])
RETURNS TABLE (ord integer, verdict text, used bigint, allowed bigint)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
  v_spent_tenants text[];
  v_spent_since bigint[];
  v_spent bigint[];
BEGIN
  -- This month's spending, once per tenant and month, only where a cap is
  -- checked (a separate statement, so it is neither planned nor run for
  -- tenants without a cap).
  IF EXISTS (SELECT 1 FROM tenant_budgets b WHERE b.tenant_id = ANY (p_tenant_ids)) THEN
    SELECT array_agg(m.tenant_id), array_agg(m.since),
           array_agg(sv_tenant_spent_since(m.tenant_id, m.since))
      INTO v_spent_tenants, v_spent_since, v_spent
      FROM (SELECT DISTINCT u.tenant_id, u.since
            FROM unnest(p_tenant_ids, p_cap_since_minutes) AS u(tenant_id, since)
            JOIN tenant_budgets b ON b.tenant_id = u.tenant_id
            WHERE u.since >= 0) m;
  END IF;
  RETURN QUERY
  WITH e AS (
    SELECT u.n::integer AS n, u.tenant_id, u.gpu_count, u.gpu_model, u.at, u.minutes,
           u.since
    FROM unnest(p_tenant_ids, p_gpu_counts, p_gpu_models, p_nows, p_credit_minutes,
                p_cap_since_minutes)
         WITH ORDINALITY AS u(tenant_id, gpu_count, gpu_model, at, minutes, since, n)
  ),
  -- Available: the trial wallet plus the paid wallet, or for a postpaid
  -- tenant the receivable and its credit limit (billing::Balance); 0 when
  -- the tenant has no accounts. The cap: NULL when the tenant has none.
  t AS MATERIALIZED (
    SELECT d.tenant_id,
           coalesce((
             SELECT coalesce(max(a.balance_micros) FILTER (WHERE a.kind = 'trial_wallet'), 0) +
                    CASE WHEN tt.billing_mode = 'postpaid'
                      THEN coalesce(max(a.balance_micros) FILTER (WHERE a.kind = 'receivable'), 0) +
                           coalesce(max(a.credit_limit_micros)
                                      FILTER (WHERE a.kind = 'receivable'), 0)
                      ELSE coalesce(max(a.balance_micros)
                                      FILTER (WHERE a.kind = 'paid_wallet'), 0) END
             FROM tenants tt JOIN ledger_accounts a
               ON coalesce(a.tenant_id, '') = tt.id AND a.tenant_id IS NOT NULL
             WHERE tt.id = d.tenant_id GROUP BY tt.billing_mode), 0)::bigint AS available,
           b.monthly_spend_cap_micros AS cap,
           CASE WHEN d.minutes > 0 THEN sv_committed_rent(d.tenant_id, d.at, '') ELSE 0 END
             AS committed
    FROM (SELECT e.tenant_id, max(e.minutes) AS minutes, min(e.at) AS at
          FROM e GROUP BY e.tenant_id) d
    LEFT JOIN tenant_budgets b ON b.tenant_id = d.tenant_id
  ),
  -- An element needs credit for the first minutes of itself and of the
  -- tenant's instances that have not ended (committed). Several elements
  -- of one tenant with the gate on never get here together: they take the
  -- element-by-element path, where each sees the rows of the ones before.
  j AS MATERIALIZED (
    SELECT e.n, e.minutes, e.since, t.available, t.cap, s.spent,
           CASE WHEN e.minutes >= 0 THEN
             (coalesce((SELECT p.unit_price_micros FROM price_book p
                        WHERE p.item_kind = 'gpu_minute' AND p.item IN (e.gpu_model, '*')
                          AND p.effective_from <= e.at
                        ORDER BY (p.item = '*'), p.effective_from DESC LIMIT 1), 0) *
              e.gpu_count + t.committed) * e.minutes END AS needed
    FROM e JOIN t ON t.tenant_id = e.tenant_id
    LEFT JOIN unnest(v_spent_tenants, v_spent_since, v_spent) AS s(tenant_id, since, spent)
      ON s.tenant_id = e.tenant_id AND s.since = e.since
  )
  SELECT j.n,
         CASE WHEN j.minutes >= 0 AND j.available < j.needed THEN 'INSUFFICIENT_CREDIT'
              WHEN j.since >= 0 AND j.spent >= j.cap THEN 'SPEND_CAP_REACHED'
              ELSE 'OK' END,
         CASE WHEN j.minutes >= 0 AND j.available < j.needed THEN j.needed
              WHEN j.since >= 0 AND j.spent >= j.cap THEN j.spent END,
         CASE WHEN j.minutes >= 0 AND j.available < j.needed THEN j.available
              WHEN j.since >= 0 AND j.spent >= j.cap THEN j.cap END
  FROM j ORDER BY j.n;
END
$$;

-- The create batch of migration 0092, with one more kind of tenant sent
-- down the element-by-element path: one with several elements in the batch
-- while the credit gate is on. Each element's gate must count the ones of
-- the same tenant accepted before it, which that path sees as rows and the
-- set-based statement could not (it judges all of them at once). A single
-- create per tenant, or the gate off, keeps the set-based path.
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
                 max(u.pending_max) OVER (PARTITION BY u.tenant_id) AS pending_max_max,
                 count(*) OVER (PARTITION BY u.tenant_id) AS of_tenant,
                 max(u.minutes) OVER (PARTITION BY u.tenant_id) AS minutes
          FROM unnest(p_tenant_ids, p_request_ids, p_trial_users, p_pending_maxes,
                      p_credit_minutes)
               AS u(tenant_id, request_id, trial_user, pending_max, minutes)) e
    WHERE e.same_request > 1 OR e.pending_min <> e.pending_max_max
       OR (e.of_tenant > 1 AND e.minutes > 0)
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
