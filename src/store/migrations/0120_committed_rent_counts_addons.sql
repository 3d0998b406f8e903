-- The per-minute commitment every credit gate counts (sv_committed_rent,
-- 0105) now holds what the tenant is charged per minute besides GPU rent:
-- the storage of its live volumes and the app fees of its unfinished
-- marketplace instances. Without them a tenant with 10 CNY could keep
-- 64 TiB of volumes (36 CNY an hour) and still pass the create's gate on
-- the same credit, or run one priced app and launch another on funds the
-- first one's fees already took.
--
-- Each part is the most one minute can cost: an hourly price spread over
-- its minutes by cumulative flooring never charges a minute more than its
-- ceiling share.
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
          GROUP BY i.gpu_model) x)
  + (SELECT coalesce(sum((a.price_per_hour_micros + 59) / 60), 0)::bigint
     FROM instances i JOIN instance_apps a ON a.instance_id = i.id
     WHERE i.tenant_id = p_tenant_id AND i.state NOT IN ('STOPPED', 'DELETED', 'FAILED')
       AND i.id <> p_exclude)
  + (SELECT coalesce(sum((v.size_gib::bigint * coalesce(
             (SELECT p.unit_price_micros FROM price_book p
              WHERE p.item_kind = 'storage_gib_hour' AND p.item IN (v.kind, '*')
                AND p.effective_from <= p_at
              ORDER BY (p.item = '*'), p.effective_from DESC LIMIT 1), 0) + 59) / 60), 0)::bigint
     FROM volumes v WHERE v.tenant_id = p_tenant_id AND v.deleted_at IS NULL);
END
$$;
