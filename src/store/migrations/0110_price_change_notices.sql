-- Tenants are told of a GPU price change (docs/billing.md, "Price book"):
-- SetGpuPrice writes a notice of this kind to every tenant with an
-- unfinished instance the new price applies to.
ALTER TABLE billing_notices DROP CONSTRAINT billing_notices_kind_check;
ALTER TABLE billing_notices ADD CONSTRAINT billing_notices_kind_check
  CHECK (kind IN ('low_credit', 'credit_exhausted', 'volume_deleted', 'credit',
                  'topup_refund', 'price_change'));
