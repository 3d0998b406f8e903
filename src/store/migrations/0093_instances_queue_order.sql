-- The queue pass reads the first --queue-max waiting instances in queue
-- order: WHERE state = 'PENDING' ORDER BY priority DESC, queue_seq LIMIT n
-- (issue 9, docs/reliability.md, "The queue's head by its index, trials at
-- signup, pools opened at start").
--
-- instances_active was (state, priority, queue_seq). Its order runs priority
-- and queue_seq the same way, so neither scan direction gives the pass's
-- order (priority descending, then queue_seq ascending): the pass read every
-- PENDING row and sorted them to keep the first n. With 17,000 waiting rows
-- that was about 25 ms a pass, and it grew with the backlog.
--
-- The same index with priority descending gives the order directly, so the
-- read stops after n entries. Every other reader filters on state alone and
-- is served as before; the partial predicate is unchanged, so a write
-- touches exactly the rows it touched before.

CREATE INDEX instances_queue ON instances (state, priority DESC, queue_seq)
  WHERE state IN ('PENDING', 'SCHEDULED', 'STARTING', 'STOPPING');
DROP INDEX instances_active;
ALTER INDEX instances_queue RENAME TO instances_active;

-- The queue's head, in queue order, for the pass. The index above serves it
-- only if the planner expects many waiting rows; its statistics lag a queue
-- that grows by thousands a minute (autovacuum analyzes a table at most
-- once a minute), and with an estimate of 65 waiting rows against 13,631
-- it chose a bitmap scan of them all and a sort (22 ms, against 2 ms by
-- the index). Without bitmap or sequential scans the index's order is the
-- cheapest way whatever the estimate. The settings hold inside the
-- function only.
CREATE FUNCTION sv_queue_head(p_limit integer)
RETURNS TABLE (id text, tenant_id text, gpu_count integer, max_leaves integer,
               priority integer, queue_seq bigint, pin_node_id text,
               state_reason text, queue_position integer)
LANGUAGE sql STABLE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
  SELECT i.id, i.tenant_id, i.gpu_count, i.max_leaves, i.priority, i.queue_seq,
         pin.node_id, i.state_reason, i.queue_position
  FROM (SELECT * FROM instances
        WHERE state = 'PENDING'
        ORDER BY priority DESC, queue_seq
        LIMIT p_limit) i
  -- A waiting instance with a node-local volume must go to that volume's
  -- node; the pins are joined once, not probed per row.
  LEFT JOIN (SELECT a.instance_id, min(v.node_id) AS node_id
             FROM volume_attachments a JOIN volumes v ON v.id = a.volume_id
             WHERE v.kind = 'node_local' AND v.node_id IS NOT NULL
             GROUP BY a.instance_id) pin ON pin.instance_id = i.id
  ORDER BY i.priority DESC, i.queue_seq
$$;
