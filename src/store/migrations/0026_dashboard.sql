-- The operator dashboard (docs/web.md) reads transfers other than charges
-- by kind and time: top-ups, trial grants and expiries, SLA refunds. Charges
-- (one row per instance-minute) stay out of this index, so metering pays
-- nothing for it.
CREATE INDEX ledger_transfers_kind_at ON ledger_transfers (kind, at) WHERE kind <> 'charge';
