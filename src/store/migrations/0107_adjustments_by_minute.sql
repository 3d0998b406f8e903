-- The SLA judge nets late-event adjustments into the rent of the hour it
-- judges (docs/sla.md, "Rent"): it looks them up by minute over every
-- instance. The index of migration 0022 leads with the instance. Partial:
-- adjustments are rare, so the index stays small.
CREATE INDEX ledger_transfers_adjustments_by_minute ON ledger_transfers (usage_minute)
  WHERE kind = 'adjustment';
