-- The fixed cost of a billing batch (docs/billing.md, "Benchmark").
--
-- The balance guard of ledger_accounts ran a PL/pgSQL function for every
-- updated account row, so a batch that charged 1,000 tenants called it
-- 1,000 times only to find the update legitimate. The same condition as a
-- WHEN clause is evaluated without a function call; the function still
-- raises for a direct update. In a trigger's WHEN clause pg_trigger_depth()
-- is the depth of the statement that updates (0 for a direct UPDATE, 1 for
-- the UPDATE inside ledger_apply_transfers/ledger_apply_charges), one less
-- than inside the guard function itself, hence < 1 here and < 2 there.
DROP TRIGGER ledger_accounts_guard ON ledger_accounts;
CREATE TRIGGER ledger_accounts_guard BEFORE UPDATE ON ledger_accounts
  FOR EACH ROW
  WHEN (NEW.balance_micros <> OLD.balance_micros AND pg_trigger_depth() < 1)
  EXECUTE FUNCTION ledger_guard_balance();

-- Metering takes the intervals of RUNNING instances without running_since
-- from their events; this (normally empty) index finds them without a scan
-- of every instance.
CREATE INDEX instances_running_no_since ON instances (id)
  WHERE state = 'RUNNING' AND running_since IS NULL;

-- Every billing batch updates the wallet (or receivable) of every tenant it
-- charges and the platform revenue account. With full pages an update
-- cannot stay on its page (HOT) and adds entries to both indexes of the
-- table; half-empty pages let it stay there, which more than halves the
-- cost of those updates. Pages written from now on keep the space; pages
-- already full get it when the table is rewritten (VACUUM FULL).
ALTER TABLE ledger_accounts SET (fillfactor = 50);
