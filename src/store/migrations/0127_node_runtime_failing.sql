-- Since when a node's agent says it cannot list its container runtime
-- (Heartbeat.lists_complete false, from an agent that reports complete
-- lists; NULL while it can). Such a node's heartbeats kept it ready, so
-- the scheduler went on placing instances on a node that could start none,
-- and they stayed STARTING. The queue pass now places nothing there until
-- the runtime answers again (docs/agent.md, "A node whose runtime fails").
ALTER TABLE nodes ADD COLUMN runtime_failing_since timestamptz;
