-- Read-only operators (docs/security.md, "Operators"): support and audit
-- staff who read what operators read and change nothing but their own API
-- keys. The flag belongs to operators only and goes with the role.
ALTER TABLE users ADD COLUMN operator_read_only boolean NOT NULL DEFAULT false;
ALTER TABLE users ADD CONSTRAINT users_operator_read_only_check
  CHECK (NOT operator_read_only OR role = 'operator');
ALTER TABLE operator_changes ADD COLUMN read_only boolean NOT NULL DEFAULT false;
