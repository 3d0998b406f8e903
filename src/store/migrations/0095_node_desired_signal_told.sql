-- The desired-set signal (0094) without the deletes of instances no agent
-- was told of (issue 9, docs/agent.md, "Desired-set signal").
--
-- NOTIFY serializes the commits that send it (PostgreSQL takes one lock
-- for the queue from the notifying transaction's pre-commit to its end), so
-- a signal is not free. With 0094, every delete of a placed instance sent
-- one, and in the benchmark's create-and-delete mode most deletes find
-- their instance SCHEDULED: placed, but not yet read by its node (2,416 of
-- 2,698 deletes of placed instances in one run). Their create+delete cost
-- 13% more CPU than without the signal.
--
-- No agent has heard of a SCHEDULED instance: DesiredForNode moves an
-- instance to STARTING in the transaction that reads the set it sends, and
-- leaves out of that set any instance it could not move (a delete that
-- came between its read and its move). `told` records that move, so an
-- instance's reservations going away signal their nodes only if some node
-- was told of it. It is never reset: an instance requeued and placed again
-- signals on its next delete too, which costs a signal, never a lost one.

ALTER TABLE instances ADD COLUMN told boolean NOT NULL DEFAULT false;
UPDATE instances SET told = true WHERE state IN ('STARTING', 'RUNNING', 'STOPPING');

CREATE OR REPLACE FUNCTION sv_desired_reservations_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    PERFORM pg_notify('sv_node_desired', n.node_id)
      FROM (SELECT DISTINCT node_id FROM new_rows) n;
  ELSIF TG_OP = 'DELETE' THEN
    PERFORM pg_notify('sv_node_desired', n.node_id)
      FROM (SELECT DISTINCT o.node_id FROM old_rows o
            WHERE EXISTS (SELECT 1 FROM instances i WHERE i.id = o.instance_id AND i.told)) n;
  ELSE
    PERFORM pg_notify('sv_node_desired', n.node_id)
      FROM (SELECT node_id FROM old_rows UNION SELECT node_id FROM new_rows) n;
  END IF;
  RETURN NULL;
END
$$;

-- An instance's state: into or between the holding states, or out of the
-- ones an agent hears of (the reservations' trigger covers the ends whose
-- rows are already gone).
DROP TRIGGER instances_desired_state ON instances;
CREATE TRIGGER instances_desired_state AFTER UPDATE OF state ON instances
  FOR EACH ROW
  WHEN (OLD.state IS DISTINCT FROM NEW.state
        AND (OLD.state IN ('STARTING', 'RUNNING', 'STOPPING')
             OR NEW.state IN ('SCHEDULED', 'STARTING', 'RUNNING', 'STOPPING'))
        AND NOT (OLD.state = 'SCHEDULED' AND NEW.state = 'STARTING'))
  EXECUTE FUNCTION sv_desired_instance_state_changed();
