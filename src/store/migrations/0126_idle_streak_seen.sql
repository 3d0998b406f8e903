-- When an idle streak was last seen going on (docs/agent.md, "Idle
-- auto-stop").
--
-- The streak was idle_since compared with the clock, so it grew while no
-- telemetry arrived: after an outage of svd or of the database (whose busy
-- batches were lost), or on a node whose telemetry stopped while its
-- heartbeats went on, a busy instance was stopped as soon as the monitor
-- ran again. A streak now counts only the time telemetry saw it: the
-- monitor stops an instance when idle_seen_at is idle_seconds past
-- idle_since, and an idle batch after a silence moves idle_since forward
-- by the silence. A streak in progress at the upgrade counts as seen at its
-- start, so its next idle batch, after more than the gap, starts it again.
ALTER TABLE instances ADD COLUMN idle_seen_at timestamptz;
UPDATE instances SET idle_seen_at = idle_since WHERE idle_since IS NOT NULL;
