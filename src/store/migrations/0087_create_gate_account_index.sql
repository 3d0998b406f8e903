-- The create gate (sv_create_gates, migration 0085) finds a tenant's wallet
-- accounts through the accounts' identity index (issue 9, docs/reliability.md
-- "Benchmark"). ledger_accounts has no index on tenant_id alone, only
-- ledger_accounts_identity on (coalesce(tenant_id, ''), kind, owner), so
-- `a.tenant_id = tt.id` read every account row of every tenant for each
-- tenant of a create batch (as sv_create_gate did for each create before
-- 0085): with 2,000 tenants a sequential scan of 6,000 rows per probe,
-- against three index entries. The condition below means the same (a
-- tenant's accounts; platform accounts have no tenant). Otherwise as in 0085.

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
  -- This month's charges, once per tenant and month, only where a cap is
  -- checked (a separate statement, so it is neither planned nor run for
  -- tenants without a cap: the charges view is dear to plan).
  IF EXISTS (SELECT 1 FROM tenant_budgets b WHERE b.tenant_id = ANY (p_tenant_ids)) THEN
    SELECT array_agg(m.tenant_id), array_agg(m.since),
           array_agg((SELECT coalesce(sum(l.amount_micros), 0)::bigint
                      FROM ledger_all_transfers l
                      WHERE l.tenant_id = m.tenant_id
                        AND l.kind IN ('charge', 'app_fee', 'storage')
                        AND l.usage_minute >= m.since))
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
