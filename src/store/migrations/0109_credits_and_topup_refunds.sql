-- Operator credits and top-up refunds (docs/billing.md, "Credits and
-- refunds of top-ups").
--
-- Until now an operator had no way through svd to give a tenant money
-- (compensation for an incident beyond the SLA's refunds, a promotion) or
-- to give a payment back (a top-up entered twice, a tenant leaving with
-- unspent credit): only SQL, outside the ledger's rules.
--
-- A credit moves money from the platform's credit_expense account to the
-- tenant's paid wallet (prepaid) or receivable (postpaid), keyed
-- credit:<credit id>. A refund of a top-up moves up to the top-up's amount
-- from the same tenant account back to payment_clearing, keyed
-- topup-refund:<payment id>: one refund per payment. Each writes a notice
-- to the tenant with the operator's reason.
ALTER TABLE ledger_accounts DROP CONSTRAINT ledger_accounts_kind_check;
ALTER TABLE ledger_accounts ADD CONSTRAINT ledger_accounts_kind_check CHECK (kind IN (
  'paid_wallet', 'trial_wallet', 'receivable',
  'platform_revenue', 'promotion_expense', 'sla_refund_expense',
  'publisher_payable', 'payment_clearing', 'credit_expense'));
INSERT INTO ledger_accounts (tenant_id, kind) VALUES (NULL, 'credit_expense');

ALTER TABLE ledger_transfers DROP CONSTRAINT ledger_transfers_kind_check;
ALTER TABLE ledger_transfers ADD CONSTRAINT ledger_transfers_kind_check CHECK (kind IN (
  'charge', 'trial_grant', 'trial_expiry', 'topup', 'sla_refund', 'adjustment',
  'app_fee', 'storage', 'payout', 'balance_move', 'credit', 'topup_refund'));

ALTER TABLE billing_notices DROP CONSTRAINT billing_notices_kind_check;
ALTER TABLE billing_notices ADD CONSTRAINT billing_notices_kind_check
  CHECK (kind IN ('low_credit', 'credit_exhausted', 'volume_deleted', 'credit',
                  'topup_refund'));

-- The operator's reason of each credit and refund, by the transfer's key:
-- a replay must give the same reason (the key's content includes it).
CREATE TABLE ledger_transfer_reasons (
  idempotency_key text PRIMARY KEY,
  tenant_id       text NOT NULL REFERENCES tenants (id),
  reason          text NOT NULL CHECK (length(reason) BETWEEN 1 AND 500),
  issued_by       text NOT NULL,
  at              timestamptz NOT NULL
);
