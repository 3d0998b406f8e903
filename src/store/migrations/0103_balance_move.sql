-- A change of billing mode moves the tenant's money to the account the new
-- mode charges (docs/billing.md, "Top-ups and postpaid tenants").
--
-- A prepaid tenant made postpaid kept its paid wallet: charges went to the
-- receivable, which was invoiced in full, while the credit the tenant had
-- paid for sat unused until it went back to prepaid. Now SetBillingMode
-- moves the paid wallet's balance into the receivable (paid in advance,
-- it is spent before any debt is run up), and a postpaid tenant going back
-- to prepaid takes a positive receivable (payments beyond its charges)
-- into its paid wallet. Both are a transfer of this kind between two
-- accounts of the same tenant, keyed balance_move:<tenant>:<n>.
ALTER TABLE ledger_transfers DROP CONSTRAINT ledger_transfers_kind_check;
ALTER TABLE ledger_transfers ADD CONSTRAINT ledger_transfers_kind_check CHECK (kind IN (
  'charge', 'trial_grant', 'trial_expiry', 'topup', 'sla_refund', 'adjustment',
  'app_fee', 'storage', 'payout', 'balance_move'));
