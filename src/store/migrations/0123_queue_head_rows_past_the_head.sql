-- The queue's head (0121) adds, for every tenant with waiting rows, the
-- first 8 of them after the head's last row, whether or not the tenant
-- already has rows in the head.
--
-- 0121 added rows only for tenants with none in the head. A tenant with one
-- row there that could not be placed (a 128-GPU gang on a smaller fleet)
-- had every later request hidden while the head was full of another
-- tenant's unplaceable rows: never read, so never placed and never given a
-- hold, while younger requests of other tenants were placed: first come,
-- first served broken, and an older gang starved without bound.
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
  head_end AS (
    SELECT h.priority, h.queue_seq FROM head h
    ORDER BY h.priority, h.queue_seq DESC LIMIT 1
  ),
  i AS (
    SELECT * FROM head
    UNION ALL
    SELECT r.* FROM waiting_tenants w
    CROSS JOIN head_end e
    CROSS JOIN LATERAL (
      SELECT x.id, x.tenant_id, x.gpu_count, x.max_leaves, x.priority, x.queue_seq,
             x.state_reason, x.queue_position
      FROM instances x
      WHERE x.state = 'PENDING' AND x.tenant_id = w.tenant_id
        AND (x.priority < e.priority OR (x.priority = e.priority AND x.queue_seq > e.queue_seq))
      ORDER BY x.priority DESC, x.queue_seq
      LIMIT 8) r
    WHERE w.tenant_id IS NOT NULL
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
