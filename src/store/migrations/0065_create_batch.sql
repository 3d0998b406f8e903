-- The create path in one transaction per batch of creates (issue 9,
-- docs/reliability.md "Benchmark"). Before, a create was six transactions:
-- the trial grant, the balance, the GPU price, the spend cap, the create and
-- its COMMIT. Now the billing and budget gate runs inside the create's own
-- transaction, under the tenant's row lock, and svd hands the creates that
-- arrive together to one call of sv_create_instances (src/store/create_batch.cc),
-- each with its own verdict.

-- A user's trial grant, once ever (docs/billing.md). Billing::EnsureTrialGrant
-- and the create gate both call this, so the rule lives in one place. The
-- primary key of trial_grants makes racing first requests grant once: the
-- loser waits for the winner's commit and then inserts nothing. The posting
-- is the one internal::PostSingle writes (same key, content hash and legs).
-- Returns whether this call granted.
CREATE FUNCTION sv_grant_trial(p_user_id text, p_amount bigint, p_now timestamptz,
                               p_expires timestamptz)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_tenant text;
  v_from bigint;
  v_to bigint;
  v_hash text;
BEGIN
  INSERT INTO trial_grants (user_id, tenant_id, amount_micros, granted_at, expires_at)
    SELECT u.id, u.tenant_id, p_amount, p_now, p_expires FROM users u
    WHERE u.id = p_user_id AND u.role = 'member'
    ON CONFLICT DO NOTHING RETURNING tenant_id INTO v_tenant;
  IF v_tenant IS NULL THEN
    RETURN false;
  END IF;
  IF p_amount = 0 THEN
    RETURN true;
  END IF;
  SELECT id INTO STRICT v_from FROM ledger_accounts
    WHERE tenant_id IS NULL AND kind = 'promotion_expense' AND owner = '';
  SELECT id INTO STRICT v_to FROM ledger_accounts
    WHERE tenant_id = v_tenant AND kind = 'trial_wallet' AND owner = '';
  v_hash := md5(concat_ws('|', 'trial_grant', v_tenant, v_from, v_to, p_amount));
  INSERT INTO ledger_transfers (idempotency_key, leg, content_hash, from_account_id,
                                to_account_id, amount_micros, kind, tenant_id, at)
    VALUES ('trial:' || p_user_id, 0, v_hash, v_from, v_to, p_amount, 'trial_grant',
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

-- The billing and budget gate of a create, read under the caller's tenant
-- row lock. The figures and the rules are billing's (Billing::FillCreateGate,
-- Billing::CreditRefusal: the first p_credit_minutes of the instance must be
-- covered by the available credit, trial wallet included) and the spend
-- cap's (docs/security.md: no create once this month's charges reach the
-- cap; p_cap_since_minute is the month's first Unix minute, Asia/Shanghai).
-- verdict: OK, INSUFFICIENT_CREDIT (used = needed, allowed = available) or
-- SPEND_CAP_REACHED (used = spent this month, allowed = the cap).
-- p_credit_minutes < 0 skips the credit check (a server without billing),
-- p_cap_since_minute < 0 the spend cap (store-level callers).
CREATE FUNCTION sv_create_gate(p_tenant_id text, p_gpu_count integer, p_gpu_model text,
                               p_now timestamptz, p_credit_minutes integer,
                               p_cap_since_minute bigint,
                               OUT verdict text, OUT used bigint, OUT allowed bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_price bigint;
  v_cap bigint;
BEGIN
  verdict := 'OK';
  IF p_credit_minutes >= 0 THEN
    v_price := coalesce((
      SELECT p.unit_price_micros FROM price_book p
      WHERE p.item_kind = 'gpu_minute' AND p.item IN (p_gpu_model, '*')
        AND p.effective_from <= p_now
      ORDER BY (p.item = '*'), p.effective_from DESC LIMIT 1), 0);
    used := v_price * p_gpu_count * p_credit_minutes;
    -- Available: the trial wallet plus the paid wallet, or for a postpaid
    -- tenant the receivable and its credit limit (billing::Balance).
    SELECT coalesce(max(a.balance_micros) FILTER (WHERE a.kind = 'trial_wallet'), 0) +
           CASE WHEN t.billing_mode = 'postpaid'
             THEN coalesce(max(a.balance_micros) FILTER (WHERE a.kind = 'receivable'), 0) +
                  coalesce(max(a.credit_limit_micros) FILTER (WHERE a.kind = 'receivable'), 0)
             ELSE coalesce(max(a.balance_micros) FILTER (WHERE a.kind = 'paid_wallet'), 0) END
      INTO allowed
      FROM tenants t JOIN ledger_accounts a ON a.tenant_id = t.id
      WHERE t.id = p_tenant_id GROUP BY t.billing_mode;
    allowed := coalesce(allowed, 0);
    IF allowed < used THEN
      verdict := 'INSUFFICIENT_CREDIT';
      RETURN;
    END IF;
  END IF;
  IF p_cap_since_minute < 0 THEN
    used := NULL;
    allowed := NULL;
    RETURN;
  END IF;
  SELECT b.monthly_spend_cap_micros INTO v_cap FROM tenant_budgets b
    WHERE b.tenant_id = p_tenant_id;
  IF FOUND THEN
    SELECT coalesce(sum(t.amount_micros), 0)::bigint INTO used FROM ledger_all_transfers t
      WHERE t.tenant_id = p_tenant_id AND t.kind IN ('charge', 'app_fee', 'storage')
        AND t.usage_minute >= p_cap_since_minute;
    IF used >= v_cap THEN
      verdict := 'SPEND_CAP_REACHED';
      allowed := v_cap;
      RETURN;
    END IF;
  END IF;
  used := NULL;
  allowed := NULL;
END
$$;

-- Creates a batch of instances in the caller's one transaction, element by
-- element in array order, each with its own verdict (row ord = array index).
-- Per element, as sv_create_instance (migration 0036) did for one: the
-- tenant's row lock, the trial grant of p_trial_users[i] ('' = none), the
-- idempotency lookup, the gate above, the instance limit, the pending quota
-- (p_pending_maxes[i] < 0 skips it), the row and its first event. Every
-- statement of a VOLATILE function takes a fresh snapshot and sees the rows
-- the earlier elements wrote, so the limits stay exact within a batch and
-- across batches (a batch holds its tenants' row locks until it commits), and
-- a request_id repeated within a batch answers EXISTS or REUSED.
-- svd passes the elements sorted by tenant, so concurrent batches lock
-- tenant rows in one order.
-- verdict: CREATED, EXISTS / REUSED (existing_id), INSTANCE_LIMIT_REACHED /
-- QUOTA_EXCEEDED (used, allowed), or the gate's refusal (see sv_create_gate).
CREATE FUNCTION sv_create_instances(
    p_ids text[], p_tenant_ids text[], p_names text[], p_gpu_counts integer[],
    p_gpu_models text[], p_images text[], p_request_ids text[], p_fingerprints text[],
    p_max_leaves integer[], p_nows timestamptz[], p_pending_maxes integer[],
    p_trial_users text[], p_trial_amounts bigint[], p_trial_expires timestamptz[],
    p_credit_minutes integer[], p_cap_since_minutes bigint[], p_active_max integer)
RETURNS TABLE (ord integer, verdict text, existing_id text, used bigint, allowed bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  i integer;
  v_tenant text;
  v_locked text;
  v_fingerprint text;
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
    ord := i;
    verdict := NULL;
    existing_id := NULL;
    used := NULL;
    allowed := NULL;
    v_tenant := p_tenant_ids[i];
    IF v_locked IS DISTINCT FROM v_tenant THEN
      PERFORM 1 FROM tenants WHERE id = v_tenant FOR UPDATE;
      v_locked := v_tenant;
    END IF;
    IF p_trial_users[i] <> '' THEN
      PERFORM sv_grant_trial(p_trial_users[i], p_trial_amounts[i], p_nows[i],
                             p_trial_expires[i]);
    END IF;
    SELECT x.id, x.request_fingerprint INTO existing_id, v_fingerprint FROM instances x
      WHERE x.tenant_id = v_tenant AND x.request_id = p_request_ids[i];
    IF FOUND THEN
      verdict := CASE WHEN v_fingerprint = p_fingerprints[i] THEN 'EXISTS' ELSE 'REUSED' END;
      RETURN NEXT;
      CONTINUE;
    END IF;
    SELECT g.verdict, g.used, g.allowed INTO verdict, used, allowed
      FROM sv_create_gate(v_tenant, p_gpu_counts[i], p_gpu_models[i], p_nows[i],
                          p_credit_minutes[i], p_cap_since_minutes[i]) g;
    IF verdict <> 'OK' THEN
      RETURN NEXT;
      CONTINUE;
    END IF;
    SELECT count(*) INTO used FROM instances x
      WHERE x.tenant_id = v_tenant AND x.state NOT IN ('STOPPED', 'DELETED', 'FAILED');
    allowed := coalesce((SELECT q.instances_max FROM tenant_quotas q
                         WHERE q.tenant_id = v_tenant), p_active_max);
    IF used >= allowed THEN
      verdict := 'INSTANCE_LIMIT_REACHED';
      RETURN NEXT;
      CONTINUE;
    END IF;
    IF p_pending_maxes[i] >= 0 THEN
      SELECT count(*) INTO used FROM instances x
        WHERE x.tenant_id = v_tenant AND x.state = 'PENDING';
      allowed := coalesce((SELECT q.pending_count_max FROM tenant_quotas q
                           WHERE q.tenant_id = v_tenant), p_pending_maxes[i]);
      IF used >= allowed THEN
        verdict := 'QUOTA_EXCEEDED';
        RETURN NEXT;
        CONTINUE;
      END IF;
    END IF;
    INSERT INTO instances (id, tenant_id, name, gpu_count, gpu_model, image, state,
                           state_reason, request_id, request_fingerprint, created_at,
                           updated_at, max_leaves)
      VALUES (p_ids[i], v_tenant, p_names[i], p_gpu_counts[i], p_gpu_models[i], p_images[i],
              'PENDING', 'waiting for placement', p_request_ids[i], p_fingerprints[i],
              p_nows[i], p_nows[i], p_max_leaves[i]);
    INSERT INTO instance_events (instance_id, at, from_state, to_state, reason)
      VALUES (p_ids[i], p_nows[i], NULL, 'PENDING', 'instance accepted');
    verdict := 'CREATED';
    used := NULL;
    allowed := NULL;
    RETURN NEXT;
  END LOOP;
END
$$;

-- A delete in one round trip (Store::DeleteInstance): the instance row lock,
-- its GPUs freed, the new state and its event. Returns the row as committed,
-- or the row unchanged when it was already DELETED, or nothing when the
-- tenant has no such instance.
CREATE FUNCTION sv_delete_instance(p_tenant_id text, p_id text, p_now timestamptz)
RETURNS SETOF instances LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_state text;
BEGIN
  SELECT x.state INTO v_state FROM instances x
    WHERE x.tenant_id = p_tenant_id AND x.id = p_id FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  IF v_state = 'DELETED' THEN
    RETURN QUERY SELECT * FROM instances x WHERE x.id = p_id;
    RETURN;
  END IF;
  DELETE FROM gpu_reservations r WHERE r.instance_id = p_id;
  INSERT INTO instance_events (instance_id, at, from_state, to_state, reason)
    VALUES (p_id, p_now, v_state, 'DELETED', 'deleted by the user');
  RETURN QUERY UPDATE instances x SET state = 'DELETED', state_reason = 'deleted by the user',
      updated_at = p_now, running_since = NULL
    WHERE x.id = p_id RETURNING x.*;
END
$$;
