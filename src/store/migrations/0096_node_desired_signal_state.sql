-- Fewer and cheaper calls of the desired-set signal on instance states
-- (issue 9, docs/agent.md, "Desired-set signal").
--
-- The state trigger of 0094/0095 ran for two moves that never change what
-- an agent is told:
-- - PENDING -> SCHEDULED. Only the placement pass makes it, and it inserts
--   the reservations in the same transaction; their trigger signals the
--   nodes. The state trigger ran first (the pass updates the rows, then
--   inserts the reservations), so it found no reservation and sent nothing.
-- - STARTING -> RUNNING. In a node's set that move only turns `confirmed`
--   on, which tells the agent not to confirm the start again when its set
--   next changes. Every set is read afresh, so the next one shows it anyway;
--   the signal only added a read of each node's set per start and a NOTIFY
--   to the commit that confirmed it.
-- In a creates-only run of bench_e2e_create they were 1,024 calls, all in
-- the two seconds that fill the fleet.
--
-- And sv_notify_instance_nodes was a SQL function, which PostgreSQL plans
-- on every call (0.23 ms of a 0.64 ms call in that run); as PL/pgSQL its
-- statement is planned once per connection.

CREATE OR REPLACE FUNCTION sv_notify_instance_nodes(p_instance_id text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('sv_node_desired', r.node_id)
    FROM (SELECT DISTINCT node_id FROM gpu_reservations WHERE instance_id = p_instance_id) r;
END
$$;

-- Out of the states an agent was told of, except into RUNNING. (The way
-- into SCHEDULED is a placement, signalled by its reservations; SCHEDULED
-- -> STARTING is the read that tells the agent.)
DROP TRIGGER instances_desired_state ON instances;
CREATE TRIGGER instances_desired_state AFTER UPDATE OF state ON instances
  FOR EACH ROW
  WHEN (OLD.state IS DISTINCT FROM NEW.state
        AND OLD.state IN ('STARTING', 'RUNNING', 'STOPPING')
        AND NOT (OLD.state = 'STARTING' AND NEW.state = 'RUNNING'))
  EXECUTE FUNCTION sv_desired_instance_state_changed();
