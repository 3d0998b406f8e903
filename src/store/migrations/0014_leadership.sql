-- Leader election and fencing (docs/reliability.md).
--
-- leader_lease: the lease of the replica that runs the leader-only loops.
-- A replica takes it over when it is free (holder '') or expired, by the
-- database's clock, and bumps the epoch; the leader renews it periodically.
--
-- leader_fence: the epoch that leader-only writes must match. Each fenced
-- transaction reads it FOR SHARE; a takeover UPDATEs it, so the takeover
-- waits for the old leader's transactions in flight and rejects later ones.
-- It is a separate row so that renewals never wait on fenced work.
CREATE TABLE leader_lease (
  name text PRIMARY KEY,
  holder text NOT NULL DEFAULT '',
  epoch bigint NOT NULL DEFAULT 0,
  expires_at timestamptz NOT NULL DEFAULT '-infinity',
  acquired_at timestamptz,
  renewed_at timestamptz
);

CREATE TABLE leader_fence (
  name text PRIMARY KEY,
  epoch bigint NOT NULL DEFAULT 0
);

INSERT INTO leader_lease (name) VALUES ('control');
INSERT INTO leader_fence (name) VALUES ('control');
