-- One trial grant per tenant, not one per user (docs/billing.md, "Trial
-- grant"; docs/decisions.md).
--
-- sv_grant_trial gave every member user its own 10 CNY, and every user's
-- grant went into the tenant's one trial wallet. An owner could mint trial
-- credit with AddUser: ten added users, 100 CNY of free GPU time; removing
-- them and adding others, as much as wanted. Now the tenant's first member
-- to be granted (its owner, granted when the tenant is created) gets the
-- amount, and every later member gets a row with amount 0: it records that
-- the user was considered, so the create batches and the billing loop,
-- which look for users without a row, do not ask again. Grants already
-- made stay as they are.
--
-- The tenant's trial wallet row is locked before the check, so two members
-- granted at once (the owner at creation and a member added at once) are
-- ordered, and the second sees the first. The posting locks that row anyway
-- (the balance trigger), and ExpireTrials locks it before
-- promotion_expense, so the order of the locks is the one it already had.
CREATE INDEX trial_grants_tenant ON trial_grants (tenant_id);

CREATE OR REPLACE FUNCTION sv_grant_trial(p_user_id text, p_amount bigint, p_now timestamptz,
                                          p_expires timestamptz)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_tenant text;
  v_amount bigint;
  v_granted text;
  v_from bigint;
  v_to bigint;
  v_hash text;
BEGIN
  SELECT u.tenant_id INTO v_tenant FROM users u
    WHERE u.id = p_user_id AND u.role = 'member';
  IF v_tenant IS NULL THEN
    RETURN false;
  END IF;
  SELECT id INTO STRICT v_to FROM ledger_accounts
    WHERE tenant_id = v_tenant AND kind = 'trial_wallet' AND owner = '' FOR UPDATE;
  v_amount := CASE WHEN EXISTS (
      SELECT 1 FROM trial_grants g
      WHERE g.tenant_id = v_tenant AND g.user_id <> p_user_id AND g.amount_micros > 0)
    THEN 0 ELSE p_amount END;
  INSERT INTO trial_grants (user_id, tenant_id, amount_micros, granted_at, expires_at)
    VALUES (p_user_id, v_tenant, v_amount, p_now, p_expires)
    ON CONFLICT DO NOTHING RETURNING tenant_id INTO v_granted;
  IF v_granted IS NULL THEN
    RETURN false;
  END IF;
  IF v_amount = 0 THEN
    RETURN true;
  END IF;
  SELECT id INTO STRICT v_from FROM ledger_accounts
    WHERE tenant_id IS NULL AND kind = 'promotion_expense' AND owner = '';
  v_hash := md5(concat_ws('|', 'trial_grant', v_tenant, v_from, v_to, v_amount));
  INSERT INTO ledger_transfers (idempotency_key, leg, content_hash, from_account_id,
                                to_account_id, amount_micros, kind, tenant_id, at)
    VALUES ('trial:' || p_user_id, 0, v_hash, v_from, v_to, v_amount, 'trial_grant',
            v_tenant, p_now)
    ON CONFLICT (idempotency_key, leg) DO NOTHING;
  IF NOT FOUND AND NOT EXISTS (
      SELECT 1 FROM ledger_transfers
      WHERE idempotency_key = 'trial:' || p_user_id AND leg = 0 AND content_hash = v_hash) THEN
    RAISE EXCEPTION 'IDEMPOTENCY_KEY_REUSED: ''trial:%'' was already used for a different transfer',
      p_user_id USING ERRCODE = 'unique_violation';
  END IF;
  RETURN true;
END
$$;
