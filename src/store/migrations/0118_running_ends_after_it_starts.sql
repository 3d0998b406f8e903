-- A RUNNING interval never ends before it began (docs/billing.md, "Late
-- events"). Billing reads an instance's intervals from instance_events in
-- the order of `at`, but writers stamp `at` before they take the
-- instance's row lock (a stop or delete waiting for its lock or its batch,
-- the node-death sweep dating the stop to the last heartbeat), so an event
-- that left RUNNING could sort before the event that began the interval
-- (a start confirmed, or a resize, while it waited) and leave that
-- interval open: billed as running after the instance stopped. Every
-- event is inserted under the instance's row lock, so the latest by id is
-- the one that began the interval; an event leaving RUNNING is stamped no
-- earlier than it.
CREATE FUNCTION sv_running_end_not_before_start() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  began timestamptz;
BEGIN
  SELECT at INTO began FROM instance_events
    WHERE instance_id = NEW.instance_id ORDER BY id DESC LIMIT 1;
  IF began IS NOT NULL AND began > NEW.at THEN
    NEW.at := began;
  END IF;
  RETURN NEW;
END;
$$;

CREATE TRIGGER instance_events_running_end_not_before_start
  BEFORE INSERT ON instance_events
  FOR EACH ROW WHEN (NEW.from_state = 'RUNNING')
  EXECUTE FUNCTION sv_running_end_not_before_start();
