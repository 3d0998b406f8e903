-- Postpaid invoices also carry the app fees and storage charged to the
-- receivable (issue 10 added those transfer kinds; invoices must equal the
-- ledger for them too).
ALTER TABLE invoice_lines DROP CONSTRAINT invoice_lines_kind_check;
ALTER TABLE invoice_lines ADD CONSTRAINT invoice_lines_kind_check
  CHECK (kind IN ('usage', 'sla_refund', 'adjustment', 'app_fee', 'storage'));
ALTER TABLE invoice_lines DROP CONSTRAINT invoice_lines_sign_check;
ALTER TABLE invoice_lines ADD CONSTRAINT invoice_lines_sign_check
  CHECK ((kind IN ('usage', 'app_fee', 'storage') AND amount_micros >= 0)
         OR (kind = 'sla_refund' AND amount_micros < 0) OR kind = 'adjustment');
