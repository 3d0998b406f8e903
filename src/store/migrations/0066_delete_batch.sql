-- Deletes in one transaction per batch (src/store/create_batch.h), as
-- migration 0065 did for creates. Element by element in array order, each
-- with its own verdict (ord = array index): the instance's row lock, its GPUs
-- freed, the new state and its event, as sv_delete_instance does for one.
-- The lock is taken with SKIP LOCKED, so a batch never waits on an instance
-- row (a placement pass or an agent's report may hold one until it commits):
-- such an element answers BUSY and svd deletes it alone afterwards, waiting
-- as a single delete does. So a batch holding some rows never waits for
-- another transaction that waits for those rows.
-- verdict: DELETED, UNCHANGED (it was DELETED already), NOT_FOUND (the tenant
-- has no such instance) or BUSY.
CREATE FUNCTION sv_delete_instances(p_tenant_ids text[], p_ids text[], p_nows timestamptz[])
RETURNS TABLE (ord integer, verdict text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  i integer;
  v_state text;
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
    ord := i;
    SELECT x.state INTO v_state FROM instances x
      WHERE x.tenant_id = p_tenant_ids[i] AND x.id = p_ids[i]
      FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
      verdict := CASE WHEN EXISTS (SELECT 1 FROM instances x WHERE x.tenant_id = p_tenant_ids[i]
                                   AND x.id = p_ids[i]) THEN 'BUSY' ELSE 'NOT_FOUND' END;
    ELSIF v_state = 'DELETED' THEN
      verdict := 'UNCHANGED';
    ELSE
      DELETE FROM gpu_reservations r WHERE r.instance_id = p_ids[i];
      INSERT INTO instance_events (instance_id, at, from_state, to_state, reason)
        VALUES (p_ids[i], p_nows[i], v_state, 'DELETED', 'deleted by the user');
      UPDATE instances x SET state = 'DELETED', state_reason = 'deleted by the user',
          updated_at = p_nows[i], running_since = NULL
        WHERE x.id = p_ids[i];
      verdict := 'DELETED';
    END IF;
    RETURN NEXT;
  END LOOP;
END
$$;
