-- Revocation signal for svd's credential cache (docs/security.md, "Cached
-- authentication"). Every change to a row that an authenticated Principal
-- is built from sends NOTIFY sv_credentials with a payload naming what
-- changed; every svd LISTENs and drops the cache entries it names. NOTIFY is
-- transactional: it is delivered at COMMIT, never for a rolled-back change.
--
-- Payloads: 'key:<api key id>', 'user:<user id>', 'tenant:<tenant id>',
-- 'node:<node credential id>' and 'all' (TRUNCATE). INSERTs need no signal:
-- the cache holds only successful lookups, and a new row cannot turn a
-- success into a failure. UPDATEs that change nothing send nothing.

CREATE FUNCTION sv_notify_credentials() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  kind text := TG_ARGV[0];
  id   text;
BEGIN
  IF TG_LEVEL = 'STATEMENT' THEN
    PERFORM pg_notify('sv_credentials', 'all');
    RETURN NULL;
  END IF;
  IF TG_OP = 'UPDATE' AND OLD IS NOT DISTINCT FROM NEW THEN
    RETURN NULL;
  END IF;
  IF kind = 'member' THEN
    id := OLD.user_id;  -- A membership change affects its user's keys.
    kind := 'user';
  ELSE
    id := OLD.id;
  END IF;
  -- OLD names what a cache entry was built from (an entry is found by its
  -- key id, its user and its tenant), also when an UPDATE moves the row.
  PERFORM pg_notify('sv_credentials', kind || ':' || id);
  RETURN NULL;
END
$$;

CREATE TRIGGER api_keys_notify_credentials AFTER UPDATE OR DELETE ON api_keys
  FOR EACH ROW EXECUTE FUNCTION sv_notify_credentials('key');
CREATE TRIGGER users_notify_credentials AFTER UPDATE OR DELETE ON users
  FOR EACH ROW EXECUTE FUNCTION sv_notify_credentials('user');
CREATE TRIGGER memberships_notify_credentials AFTER UPDATE OR DELETE ON memberships
  FOR EACH ROW EXECUTE FUNCTION sv_notify_credentials('member');
CREATE TRIGGER tenants_notify_credentials AFTER UPDATE OR DELETE ON tenants
  FOR EACH ROW EXECUTE FUNCTION sv_notify_credentials('tenant');
CREATE TRIGGER node_credentials_notify_credentials AFTER UPDATE OR DELETE ON node_credentials
  FOR EACH ROW EXECUTE FUNCTION sv_notify_credentials('node');

CREATE TRIGGER api_keys_truncate_credentials AFTER TRUNCATE ON api_keys
  FOR EACH STATEMENT EXECUTE FUNCTION sv_notify_credentials('all');
CREATE TRIGGER users_truncate_credentials AFTER TRUNCATE ON users
  FOR EACH STATEMENT EXECUTE FUNCTION sv_notify_credentials('all');
CREATE TRIGGER memberships_truncate_credentials AFTER TRUNCATE ON memberships
  FOR EACH STATEMENT EXECUTE FUNCTION sv_notify_credentials('all');
CREATE TRIGGER tenants_truncate_credentials AFTER TRUNCATE ON tenants
  FOR EACH STATEMENT EXECUTE FUNCTION sv_notify_credentials('all');
