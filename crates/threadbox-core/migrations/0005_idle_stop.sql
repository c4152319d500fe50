-- Stop a sandbox after this many seconds without activity (issue 11: a TTL counted from
-- the last call, not from creation, so a long conversation is never cut mid-turn).
ALTER TABLE sandboxes ADD COLUMN idle_stop_secs INTEGER;
