-- Organisations with users and roles, scoped and expiring API keys with
-- salted hashes, the audit log, per-tenant spend caps and instance limits.
-- See docs/security.md.

-- A user's role in a tenant. users.tenant_id stays the user's home tenant;
-- users.role stays 'operator' for the platform admin, 'member' otherwise.
CREATE TABLE memberships (
  tenant_id  text NOT NULL REFERENCES tenants (id),
  user_id    text NOT NULL REFERENCES users (id),
  role       text NOT NULL CHECK (role IN ('owner', 'member', 'billing', 'viewer')),
  created_at timestamptz NOT NULL,
  PRIMARY KEY (tenant_id, user_id)
);
CREATE INDEX memberships_user ON memberships (user_id);
-- Every existing user created its tenant: it becomes the owner.
INSERT INTO memberships (tenant_id, user_id, role, created_at)
SELECT tenant_id, id, 'owner', created_at FROM users;

-- Keys: only hex(sha256(salt ':' hex(sha256(secret)))) is kept. Existing
-- rows are salted from their unsalted digest, which is then dropped.
ALTER TABLE api_keys
  ADD COLUMN salt        text,
  ADD COLUMN secret_hash text,
  ADD COLUMN scope       text NOT NULL DEFAULT 'full' CHECK (scope IN ('full', 'read_only')),
  ADD COLUMN expires_at  timestamptz,
  ADD COLUMN name        text NOT NULL DEFAULT '',
  ADD COLUMN replaced_by text;
UPDATE api_keys SET salt = md5(random()::text || clock_timestamp()::text || id);
UPDATE api_keys
   SET secret_hash = encode(sha256(convert_to(salt || ':' || secret_sha256, 'UTF8')), 'hex');
ALTER TABLE api_keys
  ALTER COLUMN salt SET NOT NULL,
  ALTER COLUMN secret_hash SET NOT NULL,
  ADD CONSTRAINT api_keys_secret_hash_length CHECK (length(secret_hash) = 64),
  DROP COLUMN secret_sha256;
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, created_at, id);

-- Every mutating call that identified its caller, written by the
-- authorization interceptor once the call's status is known.
CREATE TABLE audit_log (
  id          bigserial PRIMARY KEY,
  at          timestamptz NOT NULL,
  tenant_id   text NOT NULL,
  user_id     text NOT NULL,
  user_email  text NOT NULL,
  api_key_id  text NOT NULL,
  method      text NOT NULL,
  request_id  text NOT NULL DEFAULT '',
  code        text NOT NULL,
  reason      text NOT NULL DEFAULT '',
  peer        text NOT NULL DEFAULT ''
);
CREATE INDEX audit_log_tenant ON audit_log (tenant_id, id);

-- Optional monthly spend cap (Asia/Shanghai calendar month, like invoices).
CREATE TABLE tenant_budgets (
  tenant_id                text PRIMARY KEY REFERENCES tenants (id),
  monthly_spend_cap_micros bigint NOT NULL CHECK (monthly_spend_cap_micros >= 0),
  updated_at               timestamptz NOT NULL
);

-- Most unfinished instances of a tenant (NULL: svd's default of 1000).
ALTER TABLE tenant_quotas
  ADD COLUMN instances_max integer CHECK (instances_max BETWEEN 0 AND 1000);
