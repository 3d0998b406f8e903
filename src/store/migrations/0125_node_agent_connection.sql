-- The agent connection a node's fences may be ended by (migration 0124).
--
-- A heartbeat ends fences only when its lists reflect the last desired set
-- svd sent. Set numbers are kept per svd process, so a heartbeat that was
-- still queued on a connection the agent has since left for another replica
-- was judged against the old replica's last set, which it matched: it could
-- end a fence set after it was composed. Each registration now writes the
-- id of its connection here, and a heartbeat ends fences only while its
-- connection is the node's latest one.
ALTER TABLE nodes ADD COLUMN agent_connection text;
