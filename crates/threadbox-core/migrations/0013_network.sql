-- A sandbox's egress policy (issue 13): the policy as the API took it (JSON of
-- `NetworkPolicySpec`; NULL = none: the daemon opens no listener and the kernel refuses
-- every connection) and its generation, bumped by every change (If-Match).
ALTER TABLE sandboxes ADD COLUMN network_policy TEXT;
ALTER TABLE sandboxes ADD COLUMN network_generation INTEGER NOT NULL DEFAULT 0;
