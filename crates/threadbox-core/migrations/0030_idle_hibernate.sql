-- Hibernate a sandbox after this many seconds without activity (issue 16, ADR 0129):
-- the longer idle step after idle_pause_secs, before idle_stop_secs.
ALTER TABLE sandboxes ADD COLUMN idle_hibernate_secs INTEGER;
