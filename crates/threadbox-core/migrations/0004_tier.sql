-- The isolation tier that runs each sandbox (issue 12's driver seam); every sandbox made
-- before tiers existed ran in the jail.
ALTER TABLE sandboxes ADD COLUMN tier TEXT NOT NULL DEFAULT 'jail';
