-- Whether the sandbox gets the in-sandbox OTLP endpoint (issue 17, ADR 0091): the daemon
-- listens on 127.0.0.1:4318 in its netns and forwards spans to the operator's collector.
ALTER TABLE sandboxes ADD COLUMN otlp_relay INTEGER NOT NULL DEFAULT 0;
