-- The minutes of a judged hour that the ledger charged, as the judge used
-- them (sla::MinuteBits, src/sla/window.h): bit m (0-59) for minute m of
-- the hour, bit 60 when the minute before the hour was charged, bit 61
-- when the minute after it was.
--
-- The judge used to count every slot from the first charged minute to the
-- end of the last, so an instance stopped at :10 and started at :40 was
-- judged on the half hour between, when it held no GPUs and paid nothing,
-- and the slots before a start or after a stop in a minute charged whole
-- counted as missing telemetry (docs/sla.md, "Which slots are judged").
-- Rows judged before this migration keep NULL: their span was contiguous,
-- from billed_from to billed_to.
ALTER TABLE sla_windows ADD COLUMN billed_minutes bigint
  CHECK (billed_minutes IS NULL OR billed_minutes BETWEEN 1 AND (1::bigint << 62) - 1);
