-- A webhook that keeps failing is turned off (docs/notifications.md,
-- "When a receiver keeps failing"): failing_since is the first failure
-- after the last delivery; once it is older than svd's
-- --webhook-give-up-hours the webhook is disabled (disabled_at, with the
-- last error) and the tenant gets a 'webhook_disabled' notice. Setting the
-- webhook again turns it back on, and what was not delivered is sent.
ALTER TABLE tenant_webhooks
  ADD COLUMN failing_since timestamptz,
  ADD COLUMN disabled_at timestamptz,
  ADD COLUMN disabled_reason text NOT NULL DEFAULT '';

ALTER TABLE billing_notices DROP CONSTRAINT billing_notices_kind_check;
ALTER TABLE billing_notices ADD CONSTRAINT billing_notices_kind_check
  CHECK (kind IN ('low_credit', 'credit_exhausted', 'volume_deleted', 'credit',
                  'topup_refund', 'price_change', 'suspension', 'instance_ended',
                  'webhook_disabled'));
