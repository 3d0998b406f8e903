-- Volumes whose storage goes unpaid are deleted after a grace period
-- (docs/storage.md, "Unpaid storage"; docs/decisions.md).
--
-- Storage is charged every minute a volume lives. When the tenant's credit
-- cannot pay it, the minute is recorded in storage_shortfalls and the
-- volume is kept; nothing ever ended that, so a tenant could keep 1,000
-- volumes of 64 TiB unpaid for good, and storage_shortfalls grew by a row
-- per volume and minute.
--
-- unpaid_since_minute is the first minute of the volume's current run of
-- unpaid minutes (a minute is unpaid when its storage was not charged in
-- full), NULL while its last billed minute was paid. The metering pass
-- sets and clears it with the storage it charges; the billing loop deletes
-- live volumes unpaid since before the grace period.
ALTER TABLE volumes ADD COLUMN unpaid_since_minute bigint;
CREATE INDEX volumes_unpaid ON volumes (unpaid_since_minute)
  WHERE unpaid_since_minute IS NOT NULL AND deleted_at IS NULL;

-- Volumes unpaid now, from their earliest unpaid minute since the last
-- paid one (the shortfalls so far).
UPDATE volumes v SET unpaid_since_minute = (
    SELECT min(s.usage_minute) FROM storage_shortfalls s
    WHERE s.volume_id = v.id
      AND s.usage_minute > coalesce((
        SELECT max(t.usage_minute) FROM ledger_transfers t
        WHERE t.kind = 'storage' AND t.idempotency_key LIKE 'storage:' || v.id || ':%'
          AND NOT EXISTS (SELECT 1 FROM storage_shortfalls x
                          WHERE x.volume_id = v.id AND x.usage_minute = t.usage_minute)),
        -1))
  WHERE v.deleted_at IS NULL
    AND EXISTS (SELECT 1 FROM storage_shortfalls s WHERE s.volume_id = v.id);

-- The notice of a deleted volume.
ALTER TABLE billing_notices DROP CONSTRAINT billing_notices_kind_check;
ALTER TABLE billing_notices ADD CONSTRAINT billing_notices_kind_check
  CHECK (kind IN ('low_credit', 'credit_exhausted', 'volume_deleted'));
