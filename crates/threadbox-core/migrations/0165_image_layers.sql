-- Image layers in the tenants' disk accounting (issue 14 scope 6, ADR 0165): the layers
-- (by diff_id) each OCI catalog image stacks, with each layer's unpacked size on disk,
-- measured once when the image is catalogued (a layer is immutable). A tenant's disk
-- counts each distinct digest its sandboxes' and templates' images name, once.
CREATE TABLE image_layers (
    image   TEXT NOT NULL,
    digest  TEXT NOT NULL,
    bytes   INTEGER NOT NULL,
    PRIMARY KEY (image, digest)
);
CREATE INDEX image_layers_by_digest ON image_layers (digest);
-- An image row and its layer rows go together, whichever statement deletes the row.
CREATE TRIGGER image_layers_follow_their_image AFTER DELETE ON images
BEGIN
    DELETE FROM image_layers WHERE image = OLD.name;
END;
