-- The statement that writes the minute charges of the easy tenants of a
-- billing batch (ShortBatchSql, billing/metering.cc) moves the balances of
-- its charges itself, from the per-tenant sums it has already computed
-- (about 1,000 rows for a 12,500-instance minute), instead of the balance
-- trigger aggregating the 12,500 new rows again: about 4 ms less CPU per
-- batch (docs/billing.md, "Benchmark").
--
-- The metering transaction says so with the transaction-local setting
-- sv.charges_balanced = 'on', which it sets after the savepoint of its
-- fast path and turns off again before any other statement that inserts
-- charges (the whole batch statement, the slow path rolls back to the
-- savepoint, the app-rent path sets it off). While it is on:
--   - the balance trigger of ledger_charges does not fire;
--   - the balance guard of ledger_accounts lets a direct balance update
--     through (the statement's own).
-- Everywhere else (no setting, or 'off') nothing changes: an INSERT into
-- ledger_charges moves the balances in the same statement, and a balance
-- changes only through a trigger. The auditor checks that every balance
-- equals the sum of its transfers and charges, whichever way they moved.
DROP TRIGGER ledger_charges_apply ON ledger_charges;
CREATE TRIGGER ledger_charges_apply AFTER INSERT ON ledger_charges
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT
  WHEN (current_setting('sv.charges_balanced', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION ledger_apply_charges();

DROP TRIGGER ledger_accounts_guard ON ledger_accounts;
CREATE TRIGGER ledger_accounts_guard BEFORE UPDATE ON ledger_accounts
  FOR EACH ROW
  WHEN (NEW.balance_micros <> OLD.balance_micros AND pg_trigger_depth() < 1
        AND current_setting('sv.charges_balanced', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION ledger_guard_balance();
