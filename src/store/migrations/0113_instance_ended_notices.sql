-- A notice when the platform ends an instance the tenant did not stop
-- (docs/notifications.md): its node reported it ended or failed, its node
-- went silent, or its idle policy stopped it. Sent to webhooks; not listed
-- with the balance's billing notices, which it would crowd out.
ALTER TABLE billing_notices DROP CONSTRAINT billing_notices_kind_check;
ALTER TABLE billing_notices ADD CONSTRAINT billing_notices_kind_check
  CHECK (kind IN ('low_credit', 'credit_exhausted', 'volume_deleted', 'credit',
                  'topup_refund', 'price_change', 'suspension', 'instance_ended'));
