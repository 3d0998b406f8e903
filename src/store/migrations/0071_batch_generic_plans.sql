-- The create and delete batch functions (migrations 0065, 0066) plan their
-- statements once per connection (issue 9, docs/reliability.md "Benchmark").
--
-- PL/pgSQL plans a statement with parameters afresh for its first five runs
-- on a connection and keeps doing so whenever the generic plan looks dearer
-- than the average custom one; in the create benchmark that re-planning was
-- 8.5% of PostgreSQL's CPU. Every statement of these functions selects by a
-- key or a tenant (index probes whatever the values), so the generic plan is
-- the plan: force it. Functions they call (sv_create_gate, sv_grant_trial)
-- run under the caller's setting.
--
-- sv_create_instances also skips the trial grant call for a user who already
-- has a grant (see the comment in the body); otherwise unchanged.

CREATE OR REPLACE FUNCTION sv_create_instances(
    p_ids text[], p_tenant_ids text[], p_names text[], p_gpu_counts integer[],
    p_gpu_models text[], p_images text[], p_request_ids text[], p_fingerprints text[],
    p_max_leaves integer[], p_nows timestamptz[], p_pending_maxes integer[],
    p_trial_users text[], p_trial_amounts bigint[], p_trial_expires timestamptz[],
    p_credit_minutes integer[], p_cap_since_minutes bigint[], p_active_max integer)
RETURNS TABLE (ord integer, verdict text, existing_id text, used bigint, allowed bigint)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  i integer;
  v_tenant text;
  v_locked text;
  v_fingerprint text;
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
    ord := i;
    verdict := NULL;
    existing_id := NULL;
    used := NULL;
    allowed := NULL;
    v_tenant := p_tenant_ids[i];
    IF v_locked IS DISTINCT FROM v_tenant THEN
      PERFORM 1 FROM tenants WHERE id = v_tenant FOR UPDATE;
      v_locked := v_tenant;
    END IF;
    -- A user's grant is written once ever and its row never deleted, so a
    -- user who has one needs no call (one index probe instead of a
    -- function call and an INSERT ... ON CONFLICT per create).
    IF p_trial_users[i] <> '' AND NOT EXISTS (
        SELECT 1 FROM trial_grants g WHERE g.user_id = p_trial_users[i]) THEN
      PERFORM sv_grant_trial(p_trial_users[i], p_trial_amounts[i], p_nows[i],
                             p_trial_expires[i]);
    END IF;
    SELECT x.id, x.request_fingerprint INTO existing_id, v_fingerprint FROM instances x
      WHERE x.tenant_id = v_tenant AND x.request_id = p_request_ids[i];
    IF FOUND THEN
      verdict := CASE WHEN v_fingerprint = p_fingerprints[i] THEN 'EXISTS' ELSE 'REUSED' END;
      RETURN NEXT;
      CONTINUE;
    END IF;
    SELECT g.verdict, g.used, g.allowed INTO verdict, used, allowed
      FROM sv_create_gate(v_tenant, p_gpu_counts[i], p_gpu_models[i], p_nows[i],
                          p_credit_minutes[i], p_cap_since_minutes[i]) g;
    IF verdict <> 'OK' THEN
      RETURN NEXT;
      CONTINUE;
    END IF;
    SELECT count(*) INTO used FROM instances x
      WHERE x.tenant_id = v_tenant AND x.state NOT IN ('STOPPED', 'DELETED', 'FAILED');
    allowed := coalesce((SELECT q.instances_max FROM tenant_quotas q
                         WHERE q.tenant_id = v_tenant), p_active_max);
    IF used >= allowed THEN
      verdict := 'INSTANCE_LIMIT_REACHED';
      RETURN NEXT;
      CONTINUE;
    END IF;
    IF p_pending_maxes[i] >= 0 THEN
      SELECT count(*) INTO used FROM instances x
        WHERE x.tenant_id = v_tenant AND x.state = 'PENDING';
      allowed := coalesce((SELECT q.pending_count_max FROM tenant_quotas q
                           WHERE q.tenant_id = v_tenant), p_pending_maxes[i]);
      IF used >= allowed THEN
        verdict := 'QUOTA_EXCEEDED';
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
    used := NULL;
    allowed := NULL;
    RETURN NEXT;
  END LOOP;
END
$$;

ALTER FUNCTION sv_delete_instances(text[], text[], timestamptz[])
  SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION sv_delete_instance(text, text, timestamptz)
  SET plan_cache_mode = force_generic_plan;
