-- Per-sandbox disk quota (ADR 0007): the size of the sandbox's loop-mounted disk image.
-- 0 marks sandboxes created before quotas (a plain upper directory, no limit).
ALTER TABLE sandboxes ADD COLUMN disk_bytes INTEGER NOT NULL DEFAULT 0;
