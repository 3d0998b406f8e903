-- The create transaction's locked part in one round trip (store.cc,
-- Store::CreateInstance). Creates of one tenant queue behind the tenant's
-- row lock, which keeps the active-instance limit and the pending quota
-- exact under concurrent requests; the lock is now held for this one call
-- and the COMMIT, not for four round trips between svd and the server.
--
-- A VOLATILE PL/pgSQL function takes a fresh snapshot for each statement,
-- so the idempotency lookup and the counts after the lock see every create
-- committed before the lock was granted (one plain SQL statement would not).
--
-- verdict: CREATED (the row and its first event are written), EXISTS (the
-- same request_id with the same content: existing_id is the answer),
-- REUSED (the same request_id with other content: existing_id),
-- INSTANCE_LIMIT_REACHED or QUOTA_EXCEEDED (used and allowed say why).
-- p_pending_max < 0 skips the pending quota.
CREATE FUNCTION sv_create_instance(
    p_id text, p_tenant_id text, p_name text, p_gpu_count integer, p_gpu_model text,
    p_image text, p_request_id text, p_fingerprint text, p_now timestamptz,
    p_max_leaves integer, p_active_max integer, p_pending_max integer,
    OUT verdict text, OUT existing_id text, OUT used bigint, OUT allowed integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  existing_fingerprint text;
BEGIN
  PERFORM 1 FROM tenants WHERE id = p_tenant_id FOR UPDATE;
  SELECT i.id, i.request_fingerprint INTO existing_id, existing_fingerprint
    FROM instances i WHERE i.tenant_id = p_tenant_id AND i.request_id = p_request_id;
  IF FOUND THEN
    verdict := CASE WHEN existing_fingerprint = p_fingerprint THEN 'EXISTS' ELSE 'REUSED' END;
    RETURN;
  END IF;
  SELECT count(*) INTO used FROM instances
    WHERE tenant_id = p_tenant_id AND state NOT IN ('STOPPED', 'DELETED', 'FAILED');
  allowed := coalesce((SELECT instances_max FROM tenant_quotas WHERE tenant_id = p_tenant_id),
                      p_active_max);
  IF used >= allowed THEN
    verdict := 'INSTANCE_LIMIT_REACHED';
    RETURN;
  END IF;
  IF p_pending_max >= 0 THEN
    SELECT count(*) INTO used FROM instances
      WHERE tenant_id = p_tenant_id AND state = 'PENDING';
    allowed := coalesce((SELECT pending_count_max FROM tenant_quotas
                         WHERE tenant_id = p_tenant_id), p_pending_max);
    IF used >= allowed THEN
      verdict := 'QUOTA_EXCEEDED';
      RETURN;
    END IF;
  END IF;
  INSERT INTO instances (id, tenant_id, name, gpu_count, gpu_model, image, state, state_reason,
                         request_id, request_fingerprint, created_at, updated_at, max_leaves)
    VALUES (p_id, p_tenant_id, p_name, p_gpu_count, p_gpu_model, p_image, 'PENDING',
            'waiting for placement', p_request_id, p_fingerprint, p_now, p_now, p_max_leaves);
  INSERT INTO instance_events (instance_id, at, from_state, to_state, reason)
    VALUES (p_id, p_now, NULL, 'PENDING', 'instance accepted');
  verdict := 'CREATED';
END
$$;
