-- An operator's cordon or drain outlives the node going down. Down was
-- written over the node's state, and an agent registering again made the
-- node ready: a node drained for repair and powered off took placements as
-- soon as it booted. The state the node returns to is kept here while it
-- is down (NULL: ready), and a cordon, drain or uncordon of a down node is
-- recorded here for its return.
ALTER TABLE nodes ADD COLUMN state_when_back text
  CHECK (state_when_back IN ('cordoned', 'draining'));
