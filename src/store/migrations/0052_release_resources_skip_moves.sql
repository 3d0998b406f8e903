-- instances_release_node_resources (migration 0018) ran volumes_complete_moves
-- on every stop and delete, about 0.4 ms each, though a move is rare. It now
-- runs it only while some volume is moving (the partial index volumes_moving
-- answers that at once). Otherwise unchanged.
CREATE OR REPLACE FUNCTION instances_release_node_resources() RETURNS trigger AS $$
BEGIN
  DELETE FROM node_port_bindings WHERE instance_id = NEW.id;
  IF NEW.state = 'DELETED' THEN
    DELETE FROM volume_attachments WHERE instance_id = NEW.id;
  ELSE
    DELETE FROM volume_attachments WHERE instance_id = NEW.id AND state = 'detaching';
    UPDATE volume_attachments SET state = 'attached', confirmed_nodes = '{}',
           confirmed_at = NEW.updated_at
    WHERE instance_id = NEW.id AND state = 'attaching';
  END IF;
  IF EXISTS (SELECT 1 FROM volumes WHERE move_to_instance_id IS NOT NULL) THEN
    PERFORM volumes_complete_moves(NEW.updated_at);
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;
