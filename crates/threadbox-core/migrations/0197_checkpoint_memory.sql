-- A checkpoint may also hold the sandbox's memory and processes (issue 16 scope 4,
-- ADR 0195): the bytes of its memory image (also counted in size_bytes), NULL for a
-- disk-only checkpoint. The image itself is the driver's
-- (sandboxes/<id>/memory/<checkpoint>/ on gvisor), written before the row and removed
-- after it. Numbered in its ADR range so parallel branches cannot collide.
ALTER TABLE checkpoints ADD COLUMN memory_bytes INTEGER;
