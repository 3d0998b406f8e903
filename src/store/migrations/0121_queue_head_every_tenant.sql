-- The queue's head (0099) also holds the first few waiting instances of
-- every tenant that has none among the first p_limit.
--
-- The pass read only the first p_limit (--queue-max, 1,000) waiting rows in
-- queue order. One tenant whose rows there could not be placed (at its GPU
-- quota, or gangs larger than any zone) filled the head, and every other
-- tenant's later request was never read, so never placed, on an idle fleet:
-- a tenant with a GPU quota of 64 that queued 1,000 jobs (its pending
-- quota's default) stopped the cloud for everyone.
--
-- Only when the head is full are the tenants with waiting rows listed, by
-- a skip scan of instances_tenant_unfinished (one index probe per tenant),
-- and each one missing from the head adds its first 8 rows. A head that is
-- not full already holds every waiting row, and costs what it did.
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
  WITH RECURSIVE head AS MATERIALIZED (
    SELECT x.id, x.tenant_id, x.gpu_count, x.max_leaves, x.priority, x.queue_seq,
           x.state_reason, x.queue_position
    FROM instances x
    WHERE x.state = 'PENDING'
    ORDER BY x.priority DESC, x.queue_seq
    LIMIT p_limit
  ),
  waiting_tenants (tenant_id) AS (
    (SELECT x.tenant_id FROM instances x
     WHERE x.state = 'PENDING' AND (SELECT count(*) FROM head) >= p_limit
     ORDER BY x.tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT x.tenant_id FROM instances x
            WHERE x.state = 'PENDING' AND x.tenant_id > w.tenant_id
            ORDER BY x.tenant_id LIMIT 1)
    FROM waiting_tenants w WHERE w.tenant_id IS NOT NULL
  ),
  i AS (
    SELECT * FROM head
    UNION ALL
    SELECT r.* FROM waiting_tenants w
    CROSS JOIN LATERAL (
      SELECT x.id, x.tenant_id, x.gpu_count, x.max_leaves, x.priority, x.queue_seq,
             x.state_reason, x.queue_position
      FROM instances x
      WHERE x.state = 'PENDING' AND x.tenant_id = w.tenant_id
      ORDER BY x.priority DESC, x.queue_seq
      LIMIT 8) r
    WHERE w.tenant_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM head h WHERE h.tenant_id = w.tenant_id)
  )
  SELECT i.id, i.tenant_id, i.gpu_count, i.max_leaves, i.priority, i.queue_seq,
         pin.node_id, i.state_reason, i.queue_position
  FROM i
  LEFT JOIN (SELECT a.instance_id, min(v.node_id) AS node_id
             FROM volume_attachments a JOIN volumes v ON v.id = a.volume_id
             WHERE v.kind = 'node_local' AND v.node_id IS NOT NULL
             GROUP BY a.instance_id) pin ON pin.instance_id = i.id
  ORDER BY i.priority DESC, i.queue_seq;
END
$$;
