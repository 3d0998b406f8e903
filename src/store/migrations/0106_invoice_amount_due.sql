-- An invoice says what the tenant owes, not only what the month cost.
--
-- The total is the month's charges to the receivable less its refunds. A
-- tenant that had credit on the receivable (paid credit moved there by a
-- switch to postpaid, a payment ahead of the invoice) or still owed for an
-- earlier month was told only that total, and could pay it twice or not
-- at all. Now each invoice also records, as of its issue:
--   carried:    what the receivable owed before this invoice's lines:
--               earlier charges not paid (positive) less payments and
--               credit (negative); everything with a usage minute before
--               the month's end and every payment received by the issue;
--   amount due: total + carried, at least zero.
-- In fen, carried is rounded once (half away from zero) and the amount due
-- is total_fen + carried_fen, at least zero. Invoices issued before this
-- migration have neither (NULL): what they would have said at their issue
-- cannot be recomputed from the balance now.
ALTER TABLE invoices
  ADD COLUMN carried_micros bigint,
  ADD COLUMN carried_fen bigint,
  ADD COLUMN amount_due_micros bigint,
  ADD COLUMN amount_due_fen bigint,
  ADD CONSTRAINT invoices_amount_due_check CHECK (
    (carried_micros IS NULL AND carried_fen IS NULL AND amount_due_micros IS NULL
     AND amount_due_fen IS NULL)
    OR (carried_micros IS NOT NULL AND carried_fen IS NOT NULL
        AND amount_due_micros = greatest(0, total_micros + carried_micros)
        AND amount_due_fen = greatest(0, total_fen + carried_fen)));
