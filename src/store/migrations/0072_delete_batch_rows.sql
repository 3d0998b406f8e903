-- sv_delete_instances (migration 0066) also answers each deleted row, so a
-- delete batch is one statement instead of two (issue 9, docs/reliability.md
-- "Benchmark"). svd read the rows afterwards with `id = ANY($1)`, a prepared
-- statement PostgreSQL planned afresh on every call (a custom plan for each
-- array): about 5% of a core in the create benchmark, and a round trip more
-- while the batch held its rows.
--
-- The result keeps its first two columns (ord, verdict), so a caller that
-- selects only those works unchanged; the row's columns follow, named as in
-- instances, NULL unless the verdict is DELETED (the row as this transaction
-- wrote it) or UNCHANGED (the row as locked, already DELETED). Otherwise as
-- in 0066, with 0071's plan setting.
DROP FUNCTION sv_delete_instances(text[], text[], timestamptz[]);

CREATE FUNCTION sv_delete_instances(p_tenant_ids text[], p_ids text[], p_nows timestamptz[])
RETURNS TABLE (ord integer, verdict text, id text, tenant_id text, name text,
               gpu_count integer, gpu_model text, image text, state text, state_reason text,
               request_id text, created_at timestamptz, updated_at timestamptz,
               request_fingerprint text, max_leaves integer)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
  i integer;
  v_row instances%ROWTYPE;
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
    ord := i;
    id := NULL; tenant_id := NULL; name := NULL; gpu_count := NULL; gpu_model := NULL;
    image := NULL; state := NULL; state_reason := NULL; request_id := NULL;
    created_at := NULL; updated_at := NULL; request_fingerprint := NULL; max_leaves := NULL;
    SELECT x.* INTO v_row FROM instances x
      WHERE x.tenant_id = p_tenant_ids[i] AND x.id = p_ids[i]
      FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
      verdict := CASE WHEN EXISTS (SELECT 1 FROM instances x WHERE x.tenant_id = p_tenant_ids[i]
                                   AND x.id = p_ids[i]) THEN 'BUSY' ELSE 'NOT_FOUND' END;
    ELSIF v_row.state = 'DELETED' THEN
      verdict := 'UNCHANGED';
      id := v_row.id; tenant_id := v_row.tenant_id; name := v_row.name;
      gpu_count := v_row.gpu_count; gpu_model := v_row.gpu_model; image := v_row.image;
      state := v_row.state; state_reason := v_row.state_reason;
      request_id := v_row.request_id; created_at := v_row.created_at;
      updated_at := v_row.updated_at; request_fingerprint := v_row.request_fingerprint;
      max_leaves := v_row.max_leaves;
    ELSE
      DELETE FROM gpu_reservations r WHERE r.instance_id = p_ids[i];
      INSERT INTO instance_events (instance_id, at, from_state, to_state, reason)
        VALUES (p_ids[i], p_nows[i], v_row.state, 'DELETED', 'deleted by the user');
      UPDATE instances x SET state = 'DELETED', state_reason = 'deleted by the user',
          updated_at = p_nows[i], running_since = NULL
        WHERE x.id = p_ids[i]
        RETURNING x.id, x.tenant_id, x.name, x.gpu_count, x.gpu_model, x.image, x.state,
                  x.state_reason, x.request_id, x.created_at, x.updated_at,
                  x.request_fingerprint, x.max_leaves
        INTO id, tenant_id, name, gpu_count, gpu_model, image, state, state_reason,
             request_id, created_at, updated_at, request_fingerprint, max_leaves;
      verdict := 'DELETED';
    END IF;
    RETURN NEXT;
  END LOOP;
END
$$;
