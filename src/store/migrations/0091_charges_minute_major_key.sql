-- The charges table's primary key becomes write-ordered: (minute, tenant
-- number, instance number) instead of (instance number, minute).
--
-- With the instance-major key every billing minute inserted one key next to
-- the previous minute of each running instance. On a ledger with history
-- each of those keys sits on a leaf page of its own, so a minute of 100,000
-- instances dirtied about 100,000 index pages (and, after each checkpoint,
-- wrote a full-page image of every one: 558 MB of WAL against 17 MB). A
-- minute's keys now all go to the right edge of the index, in order.
-- docs/billing.md ("A write-ordered charges key") has the measurements and
-- the readers, which now probe the key minute by minute.
--
-- The charge's identity is unchanged: `charge:{instance}:{minute}`, one row
-- per instance-minute. An instance's tenant never changes, so the tenant
-- number is a function of the instance number and the key is as unique as
-- before; the auditor checks that each row's tenant number is its
-- instance's.

-- A stable number per tenant, as instances.billing_no is per instance.
CREATE SEQUENCE tenants_billing_no_seq;
ALTER TABLE tenants ADD COLUMN billing_no bigint;
UPDATE tenants SET billing_no = n.no
FROM (SELECT id, nextval('tenants_billing_no_seq') AS no
      FROM (SELECT id FROM tenants ORDER BY created_at, id) o) n
WHERE n.id = tenants.id;
ALTER TABLE tenants
  ALTER COLUMN billing_no SET DEFAULT nextval('tenants_billing_no_seq'),
  ALTER COLUMN billing_no SET NOT NULL;
ALTER SEQUENCE tenants_billing_no_seq OWNED BY tenants.billing_no;
CREATE UNIQUE INDEX tenants_billing_no ON tenants (billing_no);

-- Existing charges get their tenant number. Charges are immutable; this is
-- the one rewrite, inside the migration's transaction.
ALTER TABLE ledger_charges ADD COLUMN tenant_no bigint;
ALTER TABLE ledger_charges DISABLE TRIGGER ledger_charges_immutable;
UPDATE ledger_charges c SET tenant_no = t.billing_no
FROM instances i JOIN tenants t ON t.id = i.tenant_id
WHERE i.billing_no = c.instance_no;
ALTER TABLE ledger_charges ENABLE TRIGGER ledger_charges_immutable;
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM ledger_charges WHERE tenant_no IS NULL) THEN
    RAISE EXCEPTION 'a minute charge names no instance; run svd audit before migrating'
      USING ERRCODE = 'data_exception';
  END IF;
END $$;
ALTER TABLE ledger_charges ALTER COLUMN tenant_no SET NOT NULL;

ALTER TABLE ledger_charges DROP CONSTRAINT ledger_charges_pkey;
ALTER TABLE ledger_charges ADD PRIMARY KEY (minute, tenant_no, instance_no);
-- The key now leads with the minute, so the BRIN index on it is redundant.
DROP INDEX ledger_charges_minute;

-- A tenant's charges in the Unix minutes [p_lo, p_hi) (NULL: no bound).
-- PostgreSQL 15 has no skip scan, so a range over minutes would read every
-- tenant's rows in it; instead the key is probed once per minute, only over
-- minutes that can hold a charge of the tenant: from its creation to the
-- last billed minute (billing_cursor). greatest() and least() skip NULLs.
-- A plain SQL function, which the planner inlines into the caller's query
-- (as long as no argument is a subquery). The ORDER BY keeps the per-minute
-- subquery from being pulled up into a join, so every minute is an index
-- probe: as a join, a caller that sorts by minute with a LIMIT got a merge
-- join of the minutes with a backward scan of the whole key (the planner
-- guesses 1,000 minutes), 288,000 rows read for a page of 100.
CREATE FUNCTION sv_tenant_charges(p_tenant_id text, p_lo bigint, p_hi bigint)
RETURNS SETOF ledger_charges LANGUAGE sql STABLE AS $$
  SELECT c.*
  FROM tenants t
  CROSS JOIN LATERAL generate_series(
         greatest(p_lo, floor(extract(epoch from t.created_at) / 60)::bigint),
         least(p_hi, (SELECT b.billed_before_minute FROM billing_cursor b)) - 1) AS gm (minute)
  CROSS JOIN LATERAL (SELECT * FROM ledger_charges y
                      WHERE y.minute = gm.minute AND y.tenant_no = t.billing_no
                      ORDER BY y.instance_no) c
  WHERE t.id = p_tenant_id
$$;

-- What a tenant was charged for usage from Unix minute p_since on: minute
-- charges, app fees and storage (the spend cap's measure, read by the
-- create gate, SecurityStore and the enforcer). Without JIT: the planner
-- guesses 1,000 minutes for generate_series and a cost above
-- jit_above_cost, and compiling took 25-28 ms of a read that takes 1 ms.
CREATE FUNCTION sv_tenant_spent_since(p_tenant_id text, p_since bigint)
RETURNS bigint LANGUAGE sql STABLE SET jit = off AS $$
  SELECT ((SELECT coalesce(sum(t.amount_micros), 0) FROM ledger_transfers t
           WHERE t.tenant_id = p_tenant_id AND t.kind IN ('app_fee', 'storage')
             AND t.usage_minute >= p_since)
        + (SELECT coalesce(sum(c.trial_micros + c.main_micros), 0)
           FROM sv_tenant_charges(p_tenant_id, p_since, NULL) c))::bigint
$$;

-- The create gate reads spending through sv_tenant_spent_since; through the
-- view ledger_all_transfers it would scan every charge, since the key no
-- longer leads with the instance. Otherwise as in 0087.
CREATE OR REPLACE FUNCTION sv_create_gates(p_tenant_ids text[], p_gpu_counts integer[],
                                p_gpu_models text[], p_nows timestamptz[],
                                p_credit_minutes integer[], p_cap_since_minutes bigint[])
RETURNS TABLE (ord integer, verdict text, used bigint, allowed bigint)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
  v_spent_tenants text[];
  v_spent_since bigint[];
  v_spent bigint[];
BEGIN
  -- This month's spending, once per tenant and month, only where a cap is
  -- checked (a separate statement, so it is neither planned nor run for
  -- tenants without a cap).
  IF EXISTS (SELECT 1 FROM tenant_budgets b WHERE b.tenant_id = ANY (p_tenant_ids)) THEN
    SELECT array_agg(m.tenant_id), array_agg(m.since),
           array_agg(sv_tenant_spent_since(m.tenant_id, m.since))
      INTO v_spent_tenants, v_spent_since, v_spent
      FROM (SELECT DISTINCT u.tenant_id, u.since
            FROM unnest(p_tenant_ids, p_cap_since_minutes) AS u(tenant_id, since)
            JOIN tenant_budgets b ON b.tenant_id = u.tenant_id
            WHERE u.since >= 0) m;
  END IF;
  RETURN QUERY
  WITH e AS (
    SELECT u.n::integer AS n, u.tenant_id, u.gpu_count, u.gpu_model, u.at, u.minutes,
           u.since
    FROM unnest(p_tenant_ids, p_gpu_counts, p_gpu_models, p_nows, p_credit_minutes,
                p_cap_since_minutes)
         WITH ORDINALITY AS u(tenant_id, gpu_count, gpu_model, at, minutes, since, n)
  ),
  -- Available: the trial wallet plus the paid wallet, or for a postpaid
  -- tenant the receivable and its credit limit (billing::Balance); 0 when
  -- the tenant has no accounts. The cap: NULL when the tenant has none.
  t AS MATERIALIZED (
    SELECT d.tenant_id,
           coalesce((
             SELECT coalesce(max(a.balance_micros) FILTER (WHERE a.kind = 'trial_wallet'), 0) +
                    CASE WHEN tt.billing_mode = 'postpaid'
                      THEN coalesce(max(a.balance_micros) FILTER (WHERE a.kind = 'receivable'), 0) +
                           coalesce(max(a.credit_limit_micros)
                                      FILTER (WHERE a.kind = 'receivable'), 0)
                      ELSE coalesce(max(a.balance_micros)
                                      FILTER (WHERE a.kind = 'paid_wallet'), 0) END
             FROM tenants tt JOIN ledger_accounts a
               ON coalesce(a.tenant_id, '') = tt.id AND a.tenant_id IS NOT NULL
             WHERE tt.id = d.tenant_id GROUP BY tt.billing_mode), 0)::bigint AS available,
           b.monthly_spend_cap_micros AS cap
    FROM (SELECT DISTINCT e.tenant_id FROM e) d
    LEFT JOIN tenant_budgets b ON b.tenant_id = d.tenant_id
  ),
  j AS MATERIALIZED (
    SELECT e.n, e.minutes, e.since, t.available, t.cap, s.spent,
           CASE WHEN e.minutes >= 0 THEN
             coalesce((SELECT p.unit_price_micros FROM price_book p
                       WHERE p.item_kind = 'gpu_minute' AND p.item IN (e.gpu_model, '*')
                         AND p.effective_from <= e.at
                       ORDER BY (p.item = '*'), p.effective_from DESC LIMIT 1), 0) *
             e.gpu_count * e.minutes END AS needed
    FROM e JOIN t ON t.tenant_id = e.tenant_id
    LEFT JOIN unnest(v_spent_tenants, v_spent_since, v_spent) AS s(tenant_id, since, spent)
      ON s.tenant_id = e.tenant_id AND s.since = e.since
  )
  SELECT j.n,
         CASE WHEN j.minutes >= 0 AND j.available < j.needed THEN 'INSUFFICIENT_CREDIT'
              WHEN j.since >= 0 AND j.spent >= j.cap THEN 'SPEND_CAP_REACHED'
              ELSE 'OK' END,
         CASE WHEN j.minutes >= 0 AND j.available < j.needed THEN j.needed
              WHEN j.since >= 0 AND j.spent >= j.cap THEN j.spent END,
         CASE WHEN j.minutes >= 0 AND j.available < j.needed THEN j.available
              WHEN j.since >= 0 AND j.spent >= j.cap THEN j.cap END
  FROM j ORDER BY j.n;
END
$$;
