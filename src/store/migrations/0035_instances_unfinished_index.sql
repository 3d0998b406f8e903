-- The create path counts a tenant's unfinished and pending instances under
-- the tenant's row lock (store.cc, Store::CreateInstance). Without this index
-- those counts walk every instance the tenant ever had, DELETED ones
-- included, so a create grew slower with the tenant's history; with it they
-- read only the unfinished rows.
CREATE INDEX instances_tenant_unfinished ON instances (tenant_id, state)
  WHERE state NOT IN ('STOPPED', 'DELETED', 'FAILED');
