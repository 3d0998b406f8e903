-- A notice when an instance starts running (docs/notifications.md): every
-- node confirmed its start and its rent runs from here, so a tenant whose
-- gang waited in the queue hears of it without polling. Written only for
-- tenants with a webhook, the one reader; not listed with the balance.
ALTER TABLE billing_notices DROP CONSTRAINT billing_notices_kind_check;
ALTER TABLE billing_notices ADD CONSTRAINT billing_notices_kind_check
  CHECK (kind IN ('low_credit', 'credit_exhausted', 'volume_deleted', 'credit',
                  'topup_refund', 'price_change', 'suspension', 'instance_ended',
                  'webhook_disabled', 'instance_running'));
