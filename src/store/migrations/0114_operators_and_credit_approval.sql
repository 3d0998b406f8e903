-- A team of operators (docs/security.md, "Operators") and the two-person
-- rule for large credits (docs/billing.md, "Credits above the approval
-- limit").
--
-- operator_changes: who made or unmade an operator, when and why. The
-- bootstrap operator (svd's --admin-key-file) has no 'added' row.
CREATE TABLE operator_changes (
  id        bigserial PRIMARY KEY,
  user_id   text NOT NULL REFERENCES users (id),
  change    text NOT NULL CHECK (change IN ('added', 'removed')),
  by_user   text NOT NULL REFERENCES users (id),
  by_email  text NOT NULL,
  reason    text NOT NULL DEFAULT '',
  at        timestamptz NOT NULL
);
CREATE INDEX operator_changes_user ON operator_changes (user_id, id);

-- credit_requests: one row per credit asked for through RequestCredit.
-- One at or under the limit is posted in the same transaction
-- ('posted', no decider); one above it waits for a second operator. The
-- credit's transfer is credit:<credit_id>, as for IssueCredit.
CREATE TABLE credit_requests (
  seq              bigserial UNIQUE,
  credit_id        text PRIMARY KEY,
  tenant_id        text NOT NULL REFERENCES tenants (id),
  amount_micros    bigint NOT NULL CHECK (amount_micros > 0),
  reason           text NOT NULL,
  needs_approval   boolean NOT NULL,
  state            text NOT NULL CHECK (state IN ('pending', 'posted', 'rejected')),
  requested_by     text NOT NULL REFERENCES users (id),
  requested_email  text NOT NULL,
  requested_at     timestamptz NOT NULL,
  expires_at       timestamptz NOT NULL,
  decided_by       text REFERENCES users (id),
  decided_email    text,
  decided_at       timestamptz,
  decision_reason  text NOT NULL DEFAULT '',
  -- The approver is never the requester (who may withdraw, i.e. reject).
  CHECK (state <> 'posted' OR decided_by IS NULL OR decided_by <> requested_by),
  CHECK ((decided_at IS NULL) = (decided_by IS NULL)),
  CHECK (CASE state
           WHEN 'pending' THEN needs_approval AND decided_at IS NULL
           WHEN 'rejected' THEN decided_at IS NOT NULL
           ELSE needs_approval = (decided_at IS NOT NULL)
         END)
);
CREATE INDEX credit_requests_pending ON credit_requests (seq) WHERE state = 'pending';
