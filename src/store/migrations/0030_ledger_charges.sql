-- Minute charges move out of ledger_transfers into ledger_charges: one
-- narrow row per instance-minute, keyed (instance number, minute), with no
-- secondary B-tree index. Posting a minute of a 100,000-instance fleet into
-- ledger_transfers paid for a text key, two legs and five indexes per
-- charge; a COPY into that table alone ran at 0.21-0.40 of a plain COPY.
-- See docs/billing.md ("Charges table") and docs/decisions.md.

-- A stable number per instance (queue_seq changes on requeue).
CREATE SEQUENCE instances_billing_no_seq;
ALTER TABLE instances ADD COLUMN billing_no bigint;
UPDATE instances SET billing_no = n.no
FROM (SELECT id, nextval('instances_billing_no_seq') AS no
      FROM (SELECT id FROM instances ORDER BY created_at, id) o) n
WHERE n.id = instances.id;
ALTER TABLE instances
  ALTER COLUMN billing_no SET DEFAULT nextval('instances_billing_no_seq'),
  ALTER COLUMN billing_no SET NOT NULL;
ALTER SEQUENCE instances_billing_no_seq OWNED BY instances.billing_no;
CREATE UNIQUE INDEX instances_billing_no ON instances (billing_no);

-- One minute charge: the posting `charge:{instance}:{minute}`. The primary
-- key is its idempotency key. It is double entry on one row: the trial
-- wallet pays trial_micros and the paid wallet or receivable (main_account)
-- pays main_micros, both to revenue_account (platform revenue). The row
-- holds its whole content (GPU count, unit price, both parts, the
-- accounts), so a replay is compared column by column instead of by a hash.
-- No FOREIGN KEYs, as on ledger_transfers: ledger_apply_charges checks
-- set-wise that every account exists, and the auditor checks that the
-- accounts belong to the instance's tenant.
CREATE TABLE ledger_charges (
  instance_no     bigint NOT NULL,          -- instances.billing_no
  minute          bigint NOT NULL,          -- Unix minute charged
  gpu_count       integer NOT NULL CHECK (gpu_count > 0),
  unit_price      bigint NOT NULL CHECK (unit_price > 0),   -- µ¥ per GPU-minute
  trial_account   bigint,
  trial_micros    bigint NOT NULL CHECK (trial_micros >= 0),
  main_account    bigint,
  main_micros     bigint NOT NULL CHECK (main_micros >= 0),
  revenue_account bigint NOT NULL,
  at              timestamptz NOT NULL,     -- when it was posted
  PRIMARY KEY (instance_no, minute),
  CHECK (trial_micros + main_micros > 0),
  CHECK (trial_micros + main_micros <= gpu_count * unit_price),
  CHECK ((trial_micros > 0) = (trial_account IS NOT NULL)),
  CHECK ((main_micros > 0) = (main_account IS NOT NULL)),
  CHECK (revenue_account NOT IN (coalesce(trial_account, 0), coalesce(main_account, 0)))
);
-- Rows arrive in minute order, so a BRIN index (a few pages, nearly free
-- to maintain) finds the minutes of an hour for the SLA judge and the
-- dashboard without a B-tree.
CREATE INDEX ledger_charges_minute ON ledger_charges USING brin (minute);

-- Existing charges (two legs under one key) become rows. Their content
-- hash covered (instance, minute, GPU count, unit price, charged, trial
-- part); the count and the price are recovered (the price in effect at the
-- minute's start, the count from the gross) and the hash is checked.
CREATE TEMP TABLE migrated_charges AS
WITH legs AS (
  SELECT t.instance_id, t.usage_minute AS minute, min(t.content_hash) AS content_hash,
         max(t.content_hash) AS content_hash_max,
         max(t.from_account_id) FILTER (WHERE t.leg = 0) AS trial_account,
         coalesce(sum(t.amount_micros) FILTER (WHERE t.leg = 0), 0)::bigint AS trial_micros,
         max(t.from_account_id) FILTER (WHERE t.leg = 1) AS main_account,
         coalesce(sum(t.amount_micros) FILTER (WHERE t.leg = 1), 0)::bigint AS main_micros,
         max(t.to_account_id) AS revenue_account, min(t.at) AS at
  FROM ledger_transfers t WHERE t.kind = 'charge'
  GROUP BY t.instance_id, t.usage_minute
)
SELECT l.*, i.billing_no, s.gross_micros AS shortfall_gross,
       coalesce((SELECT p.unit_price_micros FROM price_book p WHERE p.item_kind = 'gpu_minute'
                   AND p.item IN (i.gpu_model, '*')
                   AND p.effective_from <= to_timestamp(l.minute * 60)
                 ORDER BY (p.item = '*'), p.effective_from DESC LIMIT 1), 0) AS unit_price
FROM legs l JOIN instances i ON i.id = l.instance_id
LEFT JOIN billing_shortfalls s ON s.instance_id = l.instance_id AND s.usage_minute = l.minute;

DO $$
DECLARE
  bad bigint;
BEGIN
  SELECT count(*) INTO bad FROM migrated_charges m
  WHERE CASE WHEN m.unit_price <= 0 OR m.content_hash <> m.content_hash_max THEN true
     ELSE m.content_hash <> md5(m.instance_id || '|' || m.minute || '|'
          || (coalesce(m.shortfall_gross, m.trial_micros + m.main_micros) / m.unit_price)
          || '|' || m.unit_price || '|' || (m.trial_micros + m.main_micros) || '|'
          || m.trial_micros) END;
  IF bad > 0 THEN
    RAISE EXCEPTION '% minute charges cannot be migrated: their content does not match their hash',
      bad USING ERRCODE = 'data_exception';
  END IF;
END $$;

INSERT INTO ledger_charges (instance_no, minute, gpu_count, unit_price, trial_account,
  trial_micros, main_account, main_micros, revenue_account, at)
SELECT billing_no, minute,
       (coalesce(shortfall_gross, trial_micros + main_micros) / unit_price)::integer,
       unit_price, trial_account, trial_micros, main_account, main_micros, revenue_account, at
FROM migrated_charges;
DROP TABLE migrated_charges;

-- The legs leave ledger_transfers; balances already hold them, so neither
-- the balance trigger below (created after this) nor the delete changes one.
ALTER TABLE ledger_transfers DISABLE TRIGGER ledger_transfers_immutable;
DELETE FROM ledger_transfers WHERE kind = 'charge';
ALTER TABLE ledger_transfers ENABLE TRIGGER ledger_transfers_immutable;
ALTER TABLE ledger_transfers ADD CONSTRAINT ledger_transfers_no_charges CHECK (kind <> 'charge');
DROP INDEX ledger_transfers_usage;  -- It indexed only charges.

-- Balances follow charges inside the inserting statement, as for transfers.
CREATE FUNCTION ledger_apply_charges() RETURNS trigger AS $$
DECLARE
  accounts_touched bigint;
  accounts_updated bigint;
BEGIN
  WITH d AS (
    SELECT account_id, sum(delta)::bigint AS delta FROM (
      SELECT trial_account AS account_id, -sum(trial_micros) AS delta
      FROM new_rows WHERE trial_micros > 0 GROUP BY 1
      UNION ALL
      SELECT main_account, -sum(main_micros) FROM new_rows WHERE main_micros > 0 GROUP BY 1
      UNION ALL
      SELECT revenue_account, sum(trial_micros + main_micros) FROM new_rows GROUP BY 1) legs
    GROUP BY account_id
  ), u AS (
    UPDATE ledger_accounts a SET balance_micros = a.balance_micros + d.delta
    FROM d WHERE a.id = d.account_id RETURNING a.id
  )
  SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM u)
    INTO accounts_touched, accounts_updated;
  IF accounts_updated <> accounts_touched THEN
    RAISE EXCEPTION 'a charge names an account that does not exist'
      USING ERRCODE = 'foreign_key_violation';
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER ledger_charges_apply AFTER INSERT ON ledger_charges
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION ledger_apply_charges();
CREATE TRIGGER ledger_charges_immutable BEFORE UPDATE OR DELETE ON ledger_charges
  FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

-- The charges as the legs they used to be, in ledger_transfers' columns:
-- leg 0 from the trial wallet, leg 1 from the paid wallet or receivable.
-- src/src_no/src_minute order them for keyset paging (ListTransfers).
CREATE VIEW ledger_charge_legs AS
SELECT NULL::bigint AS id, 'charge:' || i.id || ':' || c.minute AS idempotency_key,
       l.leg::smallint AS leg, l.from_account_id, c.revenue_account AS to_account_id,
       l.amount AS amount_micros, 'CNY'::text AS currency, 'charge'::text AS kind,
       i.tenant_id, i.id AS instance_id, c.minute AS usage_minute, i.gpu_model, c.at,
       1::smallint AS src, c.instance_no AS src_no, c.minute AS src_minute
FROM ledger_charges c
JOIN instances i ON i.billing_no = c.instance_no
CROSS JOIN LATERAL (VALUES (0, c.trial_account, c.trial_micros),
                           (1, c.main_account, c.main_micros)) AS l (leg, from_account_id, amount)
WHERE l.amount > 0;

-- Every transfer, minute charges included: what readers that mix kinds
-- (balances, revenue, spend caps, the dashboard, ListTransfers) read.
CREATE VIEW ledger_all_transfers AS
SELECT t.id, t.idempotency_key, t.leg, t.from_account_id, t.to_account_id, t.amount_micros,
       t.currency, t.kind, t.tenant_id, t.instance_id, t.usage_minute, t.gpu_model, t.at,
       0::smallint AS src, t.id AS src_no, 0::bigint AS src_minute
FROM ledger_transfers t
UNION ALL
SELECT * FROM ledger_charge_legs;
