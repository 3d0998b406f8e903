-- The queue's head (migration 0093) with a plan kept per connection.
--
-- sv_queue_head was a LANGUAGE sql function. Its SET clauses keep it from
-- being inlined into the caller's prepared statement, and PostgreSQL 15
-- plans the body of such a function again on every call: under the
-- benchmark's load with deletes (a queue pass after nearly every delete)
-- that was 420 ms of planning against 87 ms of execution in 10 s
-- (docs/reliability.md, "The queue's head planned once per connection").
-- A PL/pgSQL body's static query is prepared once per connection and its
-- plan reused. The result, its order and the settings that force the
-- index (0093) are unchanged.

CREATE OR REPLACE FUNCTION sv_queue_head(p_limit integer)
RETURNS TABLE (id text, tenant_id text, gpu_count integer, max_leaves integer,
               priority integer, queue_seq bigint, pin_node_id text,
               state_reason text, queue_position integer)
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  SELECT i.id, i.tenant_id, i.gpu_count, i.max_leaves, i.priority, i.queue_seq,
         pin.node_id, i.state_reason, i.queue_position
  FROM (SELECT * FROM instances
        WHERE state = 'PENDING'
        ORDER BY priority DESC, queue_seq
        LIMIT p_limit) i
  LEFT JOIN (SELECT a.instance_id, min(v.node_id) AS node_id
             FROM volume_attachments a JOIN volumes v ON v.id = a.volume_id
             WHERE v.kind = 'node_local' AND v.node_id IS NOT NULL
             GROUP BY a.instance_id) pin ON pin.instance_id = i.id
  ORDER BY i.priority DESC, i.queue_seq;
END
$$;
