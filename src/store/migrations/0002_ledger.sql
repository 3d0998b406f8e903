-- The billing ledger: accounts, immutable double-entry transfers, the price
-- book, trial grants, the metering cursor, shortfalls, notices and invoices.
-- Amounts are bigint micro-yuan (1 CNY = 1,000,000). See docs/billing.md.

-- An account belongs to a tenant (wallets, receivable) or to the platform
-- (tenant_id NULL). `owner` tells apart several accounts of one kind, e.g.
-- the payable of each marketplace publisher.
CREATE TABLE ledger_accounts (
  id                  bigserial PRIMARY KEY,
  tenant_id           text REFERENCES tenants (id),
  kind                text NOT NULL CHECK (kind IN (
                        'paid_wallet', 'trial_wallet', 'receivable',
                        'platform_revenue', 'promotion_expense', 'sla_refund_expense',
                        'publisher_payable', 'payment_clearing')),
  owner               text NOT NULL DEFAULT '',
  currency            text NOT NULL DEFAULT 'CNY' CHECK (currency = 'CNY'),
  balance_micros      bigint NOT NULL DEFAULT 0,
  credit_limit_micros bigint NOT NULL DEFAULT 0 CHECK (credit_limit_micros >= 0),
  -- Prepaid wallets never go below zero; a receivable never beyond its limit.
  CHECK (kind NOT IN ('paid_wallet', 'trial_wallet') OR balance_micros >= 0),
  CHECK (kind <> 'receivable' OR balance_micros >= -credit_limit_micros),
  CHECK ((tenant_id IS NULL) = (kind NOT IN ('paid_wallet', 'trial_wallet', 'receivable')))
);
CREATE UNIQUE INDEX ledger_accounts_identity
  ON ledger_accounts (coalesce(tenant_id, ''), kind, owner);

INSERT INTO ledger_accounts (tenant_id, kind) VALUES
  (NULL, 'platform_revenue'), (NULL, 'promotion_expense'),
  (NULL, 'sla_refund_expense'), (NULL, 'payment_clearing');

-- Every tenant has its three accounts from its first moment.
CREATE FUNCTION ledger_open_tenant_accounts() RETURNS trigger AS $$
BEGIN
  INSERT INTO ledger_accounts (tenant_id, kind)
  SELECT NEW.id, k FROM unnest(ARRAY['paid_wallet', 'trial_wallet', 'receivable']) AS k
  ON CONFLICT DO NOTHING;
  RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER tenants_open_accounts AFTER INSERT ON tenants
  FOR EACH ROW EXECUTE FUNCTION ledger_open_tenant_accounts();
INSERT INTO ledger_accounts (tenant_id, kind)
SELECT t.id, k FROM tenants t,
  unnest(ARRAY['paid_wallet', 'trial_wallet', 'receivable']) AS k;

-- One leg of a posting. A posting is all legs sharing an idempotency key
-- (e.g. a minute charge split between the trial and the paid wallet, or a
-- marketplace charge split 70:30); every leg carries the posting's content
-- hash, so a replay can be told from a conflicting write.
CREATE TABLE ledger_transfers (
  id                bigserial PRIMARY KEY,
  idempotency_key   text NOT NULL,
  leg               smallint NOT NULL CHECK (leg BETWEEN 0 AND 7),
  content_hash      text NOT NULL,
  -- No FOREIGN KEYs here: their per-row checks halved the posting rate.
  -- ledger_apply_transfers checks set-wise that every account exists, and
  -- the auditor checks tenant_id against the accounts.
  from_account_id   bigint NOT NULL,
  to_account_id     bigint NOT NULL,
  amount_micros     bigint NOT NULL CHECK (amount_micros > 0),
  currency          text NOT NULL DEFAULT 'CNY' CHECK (currency = 'CNY'),
  kind              text NOT NULL CHECK (kind IN (
                      'charge', 'trial_grant', 'trial_expiry', 'topup',
                      'sla_refund', 'adjustment')),
  tenant_id         text,
  instance_id       text,
  usage_minute      bigint,           -- Unix minute the charge is for.
  gpu_model         text,
  at                timestamptz NOT NULL,
  UNIQUE (idempotency_key, leg),
  CHECK (from_account_id <> to_account_id)
);
CREATE INDEX ledger_transfers_tenant ON ledger_transfers (tenant_id, id);
CREATE INDEX ledger_transfers_usage ON ledger_transfers (tenant_id, usage_minute)
  WHERE kind = 'charge';

-- Balances follow transfers inside the inserting statement, so they can
-- never disagree with the transfers, and the CHECKs above refuse a statement
-- that would overdraw a wallet.
CREATE FUNCTION ledger_apply_transfers() RETURNS trigger AS $$
DECLARE
  accounts_touched bigint;
  accounts_updated bigint;
BEGIN
  WITH d AS (
    SELECT account_id, sum(delta)::bigint AS delta FROM (
      SELECT to_account_id AS account_id, amount_micros AS delta FROM new_rows
      UNION ALL
      SELECT from_account_id, -amount_micros FROM new_rows) legs
    GROUP BY account_id
  ), u AS (
    UPDATE ledger_accounts a SET balance_micros = a.balance_micros + d.delta
    FROM d WHERE a.id = d.account_id RETURNING a.id
  )
  SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM u)
    INTO accounts_touched, accounts_updated;
  IF accounts_updated <> accounts_touched THEN
    RAISE EXCEPTION 'a transfer names an account that does not exist'
      USING ERRCODE = 'foreign_key_violation';
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER ledger_transfers_apply AFTER INSERT ON ledger_transfers
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION ledger_apply_transfers();

CREATE FUNCTION ledger_refuse_change() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION '% is immutable', TG_TABLE_NAME USING ERRCODE = 'integrity_constraint_violation';
END $$ LANGUAGE plpgsql;
CREATE TRIGGER ledger_transfers_immutable BEFORE UPDATE OR DELETE ON ledger_transfers
  FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

-- A balance changes only through ledger_apply_transfers (trigger depth 2).
CREATE FUNCTION ledger_guard_balance() RETURNS trigger AS $$
BEGIN
  IF NEW.balance_micros <> OLD.balance_micros AND pg_trigger_depth() < 2 THEN
    RAISE EXCEPTION 'balances change only through transfers'
      USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER ledger_accounts_guard BEFORE UPDATE ON ledger_accounts
  FOR EACH ROW EXECUTE FUNCTION ledger_guard_balance();

-- Prices, versioned by effective time. item '*' of gpu_minute is the price of
-- any GPU model without its own row. Storage and marketplace items use the
-- same table; publisher_share_ppm is the publisher's part of a marketplace
-- price (700000 for the 70:30 split).
CREATE TABLE price_book (
  id                  bigserial PRIMARY KEY,
  item_kind           text NOT NULL CHECK (item_kind IN (
                        'gpu_minute', 'storage_gib_hour', 'marketplace_minute')),
  item                text NOT NULL,
  unit_price_micros   bigint NOT NULL CHECK (unit_price_micros >= 0),
  publisher_share_ppm integer NOT NULL DEFAULT 0
                      CHECK (publisher_share_ppm BETWEEN 0 AND 1000000),
  effective_from      timestamptz NOT NULL,
  created_at          timestamptz NOT NULL,
  UNIQUE (item_kind, item, effective_from)
);
INSERT INTO price_book (item_kind, item, unit_price_micros, effective_from, created_at)
VALUES ('gpu_minute', 'RTX 4090', 33000, '1970-01-01+00', '1970-01-01+00'),
       ('gpu_minute', '*', 33000, '1970-01-01+00', '1970-01-01+00');

-- One trial grant per user, ever: the primary key makes racing first
-- requests grant once.
CREATE TABLE trial_grants (
  user_id       text PRIMARY KEY REFERENCES users (id),
  tenant_id     text NOT NULL REFERENCES tenants (id),
  amount_micros bigint NOT NULL CHECK (amount_micros >= 0),
  granted_at    timestamptz NOT NULL,
  expires_at    timestamptz NOT NULL,
  expired       boolean NOT NULL DEFAULT false
);
CREATE INDEX trial_grants_due ON trial_grants (expires_at) WHERE NOT expired;

-- Metering cursor: every minute before billed_before_minute is billed.
CREATE TABLE billing_cursor (
  id                   integer PRIMARY KEY CHECK (id = 1),
  billed_before_minute bigint,
  first_minute         bigint,  -- Where metering began (the auditor's start).
  updated_at           timestamptz
);
INSERT INTO billing_cursor (id) VALUES (1);

-- What a capped final charge could not collect.
CREATE TABLE billing_shortfalls (
  instance_id      text NOT NULL REFERENCES instances (id),
  usage_minute     bigint NOT NULL,
  tenant_id        text NOT NULL REFERENCES tenants (id),
  gross_micros     bigint NOT NULL CHECK (gross_micros > 0),
  charged_micros   bigint NOT NULL CHECK (charged_micros >= 0),
  shortfall_micros bigint NOT NULL CHECK (shortfall_micros > 0),
  at               timestamptz NOT NULL,
  PRIMARY KEY (instance_id, usage_minute),
  CHECK (charged_micros + shortfall_micros = gross_micros)
);

-- Stops decided by metering (credit ran out), written in the metering
-- transaction and applied through Store::StopInstance afterwards, so a crash
-- in between loses none.
CREATE TABLE billing_stops (
  instance_id text NOT NULL REFERENCES instances (id),
  tenant_id   text NOT NULL REFERENCES tenants (id),
  stop_at     timestamptz NOT NULL,
  applied     boolean NOT NULL DEFAULT false,
  PRIMARY KEY (instance_id, stop_at)
);
CREATE INDEX billing_stops_pending ON billing_stops (stop_at) WHERE NOT applied;

-- Warnings and stops shown to the tenant (low credit, credit exhausted).
CREATE TABLE billing_notices (
  id          bigserial PRIMARY KEY,
  tenant_id   text NOT NULL REFERENCES tenants (id),
  kind        text NOT NULL CHECK (kind IN ('low_credit', 'credit_exhausted')),
  instance_id text,
  message     text NOT NULL,
  at          timestamptz NOT NULL
);
CREATE INDEX billing_notices_tenant ON billing_notices (tenant_id, at);

-- Finds instances that left RUNNING recently, for the metering pass.
CREATE INDEX instance_events_left_running ON instance_events (at)
  WHERE from_state = 'RUNNING';
CREATE INDEX instances_running ON instances (id) WHERE state = 'RUNNING';

-- Monthly invoices of postpaid tenants; immutable once issued.
CREATE TABLE invoices (
  id            text PRIMARY KEY,
  tenant_id     text NOT NULL REFERENCES tenants (id),
  period_start  timestamptz NOT NULL,
  period_end    timestamptz NOT NULL,
  period_label  text NOT NULL,              -- e.g. 2026-11 (Asia/Shanghai)
  total_micros  bigint NOT NULL,
  total_fen     bigint NOT NULL,
  issued_at     timestamptz NOT NULL,
  UNIQUE (tenant_id, period_start),
  CHECK (period_end > period_start)
);
CREATE TABLE invoice_lines (
  invoice_id    text NOT NULL REFERENCES invoices (id),
  line_no       integer NOT NULL,
  kind          text NOT NULL CHECK (kind IN ('usage', 'sla_refund')),
  instance_id   text NOT NULL,
  gpu_model     text NOT NULL,
  gpu_minutes   bigint NOT NULL,
  amount_micros bigint NOT NULL,
  amount_fen    bigint NOT NULL,
  PRIMARY KEY (invoice_id, line_no),
  CHECK ((kind = 'usage') = (amount_micros >= 0))
);
CREATE TRIGGER invoices_immutable BEFORE UPDATE OR DELETE ON invoices
  FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER invoice_lines_immutable BEFORE UPDATE OR DELETE ON invoice_lines
  FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
