-- Corrections for RUNNING events recorded after their minutes were billed
-- (docs/billing.md, "Late events"). The billing loop rechecks every instance
-- with a RUNNING boundary in an instance_events row it has not seen yet and
-- posts `adjustment` transfers for the difference.

-- How far the loop has looked: instance_events rows with id <= this were
-- rechecked. Starts at today's last event: older history is the auditor's.
CREATE TABLE billing_recheck_cursor (
  id                 integer PRIMARY KEY CHECK (id = 1),
  events_seen_through bigint NOT NULL
);
INSERT INTO billing_recheck_cursor (id, events_seen_through)
SELECT 1, coalesce(max(id), 0) FROM instance_events;

-- Adjustments of one instance-minute, for the recheck and the auditor.
-- Partial: charges (almost every row) skip it.
CREATE INDEX ledger_transfers_adjustments ON ledger_transfers (instance_id, usage_minute)
  WHERE kind = 'adjustment';

-- Adjustments that touch a postpaid receivable appear on the month's
-- invoice as their own lines (a refund negative, a late charge positive).
ALTER TABLE invoice_lines DROP CONSTRAINT invoice_lines_kind_check;
ALTER TABLE invoice_lines ADD CONSTRAINT invoice_lines_kind_check
  CHECK (kind IN ('usage', 'sla_refund', 'adjustment'));
ALTER TABLE invoice_lines DROP CONSTRAINT invoice_lines_check;
ALTER TABLE invoice_lines ADD CONSTRAINT invoice_lines_sign_check
  CHECK ((kind = 'usage' AND amount_micros >= 0) OR (kind = 'sla_refund' AND amount_micros < 0)
         OR kind = 'adjustment');
