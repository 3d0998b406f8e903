-- Operators suspend a tenant (docs/security.md, "Suspending a tenant"): its
-- instances are stopped and it may not create or start instances or create
-- volumes until an operator resumes it. Reads, deletes, keys and payments
-- keep working, so that the tenant can see what happened, keep or remove
-- its data and settle what it owes.
--
-- One row per suspension, kept after it is lifted (who, when, why, both
-- ways); at most one open row per tenant.
CREATE TABLE tenant_suspensions (
  id            bigserial PRIMARY KEY,
  tenant_id     text NOT NULL REFERENCES tenants (id),
  suspended_at  timestamptz NOT NULL,
  suspended_by  text NOT NULL,  -- The operator's e-mail.
  reason        text NOT NULL,
  resumed_at    timestamptz,
  resumed_by    text,
  resume_reason text,
  CHECK ((resumed_at IS NULL) = (resumed_by IS NULL))
);
CREATE UNIQUE INDEX tenant_suspensions_open ON tenant_suspensions (tenant_id)
  WHERE resumed_at IS NULL;
CREATE INDEX tenant_suspensions_tenant ON tenant_suspensions (tenant_id, suspended_at);

ALTER TABLE billing_notices DROP CONSTRAINT billing_notices_kind_check;
ALTER TABLE billing_notices ADD CONSTRAINT billing_notices_kind_check
  CHECK (kind IN ('low_credit', 'credit_exhausted', 'volume_deleted', 'credit',
                  'topup_refund', 'price_change', 'suspension'));

-- The gate of 0104 with one more verdict, first of all: TENANT_SUSPENDED
-- while the tenant has an open suspension. A create holds its tenant's row
-- lock from before the gate to its commit, and a suspension takes the same
-- lock, so a create either commits before the suspension (and is stopped
-- with the tenant's other instances) or sees it. The check is one probe of
-- the partial index per tenant and batch.
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
  t AS MATERIALIZED (
    SELECT d.tenant_id,
           EXISTS (SELECT 1 FROM tenant_suspensions s
                   WHERE s.tenant_id = d.tenant_id AND s.resumed_at IS NULL) AS suspended,
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
           b.monthly_spend_cap_micros AS cap,
           CASE WHEN d.minutes > 0 THEN sv_committed_rent(d.tenant_id, d.at, '') ELSE 0 END
             AS committed
    FROM (SELECT e.tenant_id, max(e.minutes) AS minutes, min(e.at) AS at
          FROM e GROUP BY e.tenant_id) d
    LEFT JOIN tenant_budgets b ON b.tenant_id = d.tenant_id
  ),
  j AS MATERIALIZED (
    SELECT e.n, e.minutes, e.since, t.suspended, t.available, t.cap, s.spent,
           CASE WHEN e.minutes >= 0 THEN
             (coalesce((SELECT p.unit_price_micros FROM price_book p
                        WHERE p.item_kind = 'gpu_minute' AND p.item IN (e.gpu_model, '*')
                          AND p.effective_from <= e.at
                        ORDER BY (p.item = '*'), p.effective_from DESC LIMIT 1), 0) *
              e.gpu_count + t.committed) * e.minutes END AS needed
    FROM e JOIN t ON t.tenant_id = e.tenant_id
    LEFT JOIN unnest(v_spent_tenants, v_spent_since, v_spent) AS s(tenant_id, since, spent)
      ON s.tenant_id = e.tenant_id AND s.since = e.since
  )
  SELECT j.n,
         CASE WHEN j.suspended THEN 'TENANT_SUSPENDED'
              WHEN j.minutes >= 0 AND j.available < j.needed THEN 'INSUFFICIENT_CREDIT'
              WHEN j.since >= 0 AND j.spent >= j.cap THEN 'SPEND_CAP_REACHED'
              ELSE 'OK' END,
         CASE WHEN j.suspended THEN 0::bigint
              WHEN j.minutes >= 0 AND j.available < j.needed THEN j.needed
              WHEN j.since >= 0 AND j.spent >= j.cap THEN j.spent END,
         CASE WHEN j.suspended THEN 0::bigint
              WHEN j.minutes >= 0 AND j.available < j.needed THEN j.available
              WHEN j.since >= 0 AND j.spent >= j.cap THEN j.cap END
  FROM j ORDER BY j.n;
END
$$;
