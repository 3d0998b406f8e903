-- Movable instances (docs/scheduler.md, "Moving instances").
--
-- A tenant may let svd move a small instance (1-7 GPUs) to another node,
-- so that whole nodes free up for a waiting instance of 8 GPUs or more. A
-- move restarts the instance: it goes RUNNING -> SCHEDULED with its GPUs
-- reserved on the new node, and then through STARTING to RUNNING as any
-- placement does. Billing covers RUNNING only, so the minutes of the move
-- are not charged, and a minute it ran on both nodes is charged once
-- (charge:{instance}:{minute}).
--
-- Off by default: nothing is moved unless its tenant asked for it.
ALTER TABLE instances ADD COLUMN movable boolean NOT NULL DEFAULT false;

-- The queue pass reads the movable RUNNING instances only when a request
-- of whole nodes waits; this keeps that read to the few rows that qualify.
CREATE INDEX instances_movable_running ON instances (running_since)
  WHERE movable AND state = 'RUNNING';
