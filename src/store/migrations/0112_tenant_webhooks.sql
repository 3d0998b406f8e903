-- A tenant's webhook (docs/notifications.md): svd POSTs each of the
-- tenant's notices (billing_notices: low credit, credit exhausted, stops,
-- credits, refunds, price changes, suspensions) to the URL, signed with the
-- secret, oldest first, at least once.
--
-- A new webhook receives the notices written after it: those with an id
-- above starts_after (the newest id when it was set). Each delivered notice
-- gets a webhook_deliveries row, so one whose id was taken before another's
-- but committed after it is still sent. After a failure, attempts counts
-- the failed tries and next_attempt_at holds the retry (the wait doubles,
-- up to an hour).
CREATE TABLE tenant_webhooks (
  tenant_id          text PRIMARY KEY REFERENCES tenants (id),
  url                text NOT NULL,
  -- The HMAC-SHA256 key of the signatures; shown to the owner once. svd
  -- needs it to sign, so it is stored as it is (unlike API keys).
  secret             text NOT NULL,
  created_at         timestamptz NOT NULL,
  created_by         text NOT NULL,
  starts_after       bigint NOT NULL,
  attempts           integer NOT NULL DEFAULT 0,
  next_attempt_at    timestamptz,
  last_attempt_at    timestamptz,
  last_error         text NOT NULL DEFAULT '',
  last_delivered_at  timestamptz
);

CREATE TABLE webhook_deliveries (
  notice_id     bigint PRIMARY KEY REFERENCES billing_notices (id),
  tenant_id     text NOT NULL REFERENCES tenants (id),
  url           text NOT NULL,
  delivered_at  timestamptz NOT NULL,
  http_status   integer NOT NULL
);

CREATE INDEX billing_notices_tenant_id ON billing_notices (tenant_id, id);
