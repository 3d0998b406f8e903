-- ListTransfers reads a tenant's transfers (everything but minute charges,
-- which live in ledger_charges) in posting order, one page at a time; this
-- index serves that order, so a page no longer sorts the tenant's whole
-- history (app fees are one row per app instance and minute). The old
-- (tenant_id, id) index stays: other readers use it.
CREATE INDEX ledger_transfers_tenant_at ON ledger_transfers (tenant_id, at, id);
