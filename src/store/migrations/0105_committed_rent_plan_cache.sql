-- sv_committed_rent (0104) as PL/pgSQL, so that its query is planned once
-- per connection instead of at every call.
--
-- A SQL function that cannot be inlined (this one is called from inside
-- sv_create_gates' CTE and from single statements) has its body planned
-- again on each call of the statement that calls it. With one unfinished
-- instance, a gate with the credit check on took 0.68-0.88 ms against
-- 0.25-0.32 ms with it off (pgbench, one client); almost all of the
-- difference was that planning. PL/pgSQL keeps the plan: 0.37-0.44 ms
-- against 0.35-0.45 ms. The result is the same.
CREATE OR REPLACE FUNCTION sv_committed_rent(p_tenant_id text, p_at timestamptz, p_exclude text)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN (
    SELECT coalesce(sum(x.gpus * coalesce(
             (SELECT p.unit_price_micros FROM price_book p
              WHERE p.item_kind = 'gpu_minute' AND p.item IN (x.gpu_model, '*')
                AND p.effective_from <= p_at
              ORDER BY (p.item = '*'), p.effective_from DESC LIMIT 1), 0)), 0)::bigint
    FROM (SELECT i.gpu_model, sum(i.gpu_count) AS gpus FROM instances i
          WHERE i.tenant_id = p_tenant_id AND i.state NOT IN ('STOPPED', 'DELETED', 'FAILED')
            AND i.id <> p_exclude
          GROUP BY i.gpu_model) x);
END
$$;
