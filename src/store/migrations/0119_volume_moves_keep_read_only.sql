-- A moved volume keeps its attachment's read-only flag (docs/storage.md,
-- "Moving"): volumes_complete_moves (migration 0018) attached every moved
-- volume for writing, so moving the read-only attachment of a read-many
-- volume made it a writer. The flag is recorded with the move and used
-- when it completes. Otherwise unchanged.
ALTER TABLE volumes ADD COLUMN move_read_only boolean NOT NULL DEFAULT false;

CREATE OR REPLACE FUNCTION volumes_complete_moves(now timestamptz) RETURNS void AS $$
BEGIN
  UPDATE volumes v SET move_to_instance_id = NULL, move_mount_path = NULL,
         move_read_only = false, updated_at = now
  FROM instances i
  WHERE v.move_to_instance_id = i.id AND i.state IN ('DELETED', 'FAILED');
  WITH ready AS (
    SELECT v.id, v.tenant_id, v.move_to_instance_id AS target, v.move_mount_path AS mount_path,
           v.move_read_only AS read_only
    FROM volumes v
    WHERE v.move_to_instance_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM volume_attachments a WHERE a.volume_id = v.id)
  ), cleared AS (
    UPDATE volumes v SET move_to_instance_id = NULL, move_mount_path = NULL,
           move_read_only = false, updated_at = now
    FROM ready r WHERE v.id = r.id
  )
  INSERT INTO volume_attachments (volume_id, instance_id, tenant_id, read_only, mount_path,
                                  state, requested_at, confirmed_at)
  SELECT r.id, r.target, r.tenant_id, r.read_only, r.mount_path,
         CASE WHEN i.state IN ('SCHEDULED', 'STARTING', 'RUNNING') THEN 'attaching'
              ELSE 'attached' END,
         now,
         CASE WHEN i.state IN ('SCHEDULED', 'STARTING', 'RUNNING') THEN NULL ELSE now END
  FROM ready r JOIN instances i ON i.id = r.target
  ON CONFLICT DO NOTHING;
END $$ LANGUAGE plpgsql;
