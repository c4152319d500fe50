//! Unit tests of image layers in the tenants' disk accounting (ADR 0165) over a temporary
//! SQLite file: distinct layers once per tenant and for each tenant, the split and its
//! sums, admission's "new to the tenant" bytes, and the layer rows' life with their image.

use super::*;
use crate::gov_store::{DiskSplit, UsageDelta};
use crate::store::tests::{row, temp_store};
use crate::store_checkpoints::CheckpointRow;
use crate::store_templates::TemplateRow;

const MIB: u64 = 1 << 20;

fn layer(d: &str, bytes: u64) -> LayerRow {
    LayerRow {
        digest: format!("sha256:{d}"),
        bytes,
    }
}

fn oci(name: &str) -> ImageRow {
    ImageRow {
        name: name.into(),
        kind: "oci".into(),
        path: Some(format!("/records/{name}.json")),
        created_at: 1,
    }
}

/// Images `a` = base + a-top and `b` = base + b-top: one layer shared.
async fn two_images(store: &Store) {
    store
        .insert_image_with_layers(
            &oci("a"),
            &[layer("base", 100 * MIB), layer("atop", 10 * MIB)],
        )
        .await
        .unwrap();
    store
        .insert_image_with_layers(
            &oci("b"),
            &[layer("base", 100 * MIB), layer("btop", 20 * MIB)],
        )
        .await
        .unwrap();
}

async fn sandbox(store: &Store, id: &str, tenant: &str, image: &str) {
    let mut r = row(store, id, tenant, None).await;
    r.image = image.into();
    r.disk_bytes = 64 * MIB;
    store.insert_sandbox(&r).await.unwrap();
}

fn template(id: &str, tenant: &str, image: &str, size: u64) -> TemplateRow {
    TemplateRow {
        id: id.into(),
        tenant: tenant.into(),
        name: id.into(),
        source: "test".into(),
        image: image.into(),
        tier: "jail".into(),
        memory_bytes: 256 * MIB,
        cpus: 1.0,
        pids: 256,
        disk_bytes: 64 * MIB,
        labels: Default::default(),
        network_policy: None,
        size_bytes: size,
        method: "copy".into(),
        created_at: 1,
    }
}

#[tokio::test]
async fn a_shared_layer_counts_once_per_tenant_and_for_each_tenant() {
    let (_dir, store) = temp_store().await;
    two_images(&store).await;
    assert_eq!(
        store.layer_bytes_of("t1").await.unwrap(),
        0,
        "no sandbox yet"
    );
    assert_eq!(store.new_layer_bytes("t1", "a").await.unwrap(), 110 * MIB);

    sandbox(&store, "sb-1", "t1", "a").await;
    assert_eq!(store.layer_bytes_of("t1").await.unwrap(), 110 * MIB);
    assert_eq!(store.new_layer_bytes("t1", "a").await.unwrap(), 0);
    // Two sandboxes of one image: its layers once.
    sandbox(&store, "sb-2", "t1", "a").await;
    assert_eq!(store.layer_bytes_of("t1").await.unwrap(), 110 * MIB);
    // Another image sharing the base: only its own top is new.
    assert_eq!(store.new_layer_bytes("t1", "b").await.unwrap(), 20 * MIB);
    sandbox(&store, "sb-3", "t1", "b").await;
    assert_eq!(store.layer_bytes_of("t1").await.unwrap(), 130 * MIB);

    // Another tenant on the same layers pays for them too, and t1's usage does not move.
    assert_eq!(store.new_layer_bytes("t2", "b").await.unwrap(), 120 * MIB);
    sandbox(&store, "sb-4", "t2", "b").await;
    assert_eq!(store.layer_bytes_of("t2").await.unwrap(), 120 * MIB);
    assert_eq!(store.layer_bytes_of("t1").await.unwrap(), 130 * MIB);
    store.delete_sandbox("sb-4").await.unwrap();
    assert_eq!(store.layer_bytes_of("t2").await.unwrap(), 0);
    assert_eq!(store.layer_bytes_of("t1").await.unwrap(), 130 * MIB);

    // The built-in image (and any rootfs directory) has no layers: nothing new.
    assert_eq!(store.new_layer_bytes("t1", "host").await.unwrap(), 0);
    sandbox(&store, "sb-5", "t1", "host").await;
    assert_eq!(store.layer_bytes_of("t1").await.unwrap(), 130 * MIB);

    // Down to one sandbox of `b`: its two layers stay, `a`'s top goes.
    for id in ["sb-1", "sb-2"] {
        store.delete_sandbox(id).await.unwrap();
    }
    assert_eq!(store.layer_bytes_of("t1").await.unwrap(), 120 * MIB);
}

#[tokio::test]
async fn a_template_holds_its_layers_without_any_sandbox() {
    let (_dir, store) = temp_store().await;
    two_images(&store).await;
    store
        .insert_template(&template("tp-1", "t1", "a", 5 * MIB))
        .await
        .unwrap();
    assert_eq!(store.layer_bytes_of("t1").await.unwrap(), 110 * MIB);
    assert_eq!(store.new_layer_bytes("t1", "a").await.unwrap(), 0);
    assert_eq!(store.new_layer_bytes("t1", "b").await.unwrap(), 20 * MIB);
    // A sandbox of the template's image adds its disk, not the layers again.
    sandbox(&store, "sb-1", "t1", "a").await;
    assert_eq!(store.layer_bytes_of("t1").await.unwrap(), 110 * MIB);
    // The image cannot go while the template uses it: its layer rows stay.
    store.delete_sandbox("sb-1").await.unwrap();
    assert!(!store.delete_unused_image("a").await.unwrap());
    assert_eq!(store.image_layers("a").await.unwrap().len(), 2);
}

#[tokio::test]
async fn the_split_counts_every_part_and_sums_to_what_admission_counts() {
    let (_dir, store) = temp_store().await;
    two_images(&store).await;
    sandbox(&store, "sb-1", "t1", "a").await;
    sandbox(&store, "sb-2", "t1", "host").await;
    // sb-1 sampled at 3 MiB: the sampled split counts that, the allocated one its size.
    store
        .apply_usage(&UsageDelta {
            sandbox_id: "sb-1".into(),
            tenant: "t1".into(),
            name: None,
            day: "2026-12-02".into(),
            at: 10,
            cpu_usec: 0,
            cgroup_usec: 0,
            mem_byte_ms: 0.0,
            mem_bytes: 0,
            disk_bytes: Some(3 * MIB as i64),
            running_ms: 0,
            paused_ms: 0,
        })
        .await
        .unwrap();
    store
        .insert_checkpoint(&CheckpointRow {
            id: "ck-1".into(),
            sandbox: "sb-1".into(),
            tenant: "t1".into(),
            label: None,
            parent: None,
            size_bytes: 2 * MIB,
            method: "copy".into(),
            created_at: 1,
            seq: 0,
            memory_bytes: None,
        })
        .await
        .unwrap();
    store
        .insert_template(&template("tp-1", "t1", "b", 7 * MIB))
        .await
        .unwrap();
    let sampled = store.disk_split_of("t1", false).await.unwrap();
    assert_eq!(
        sampled,
        DiskSplit {
            sandboxes: 3 * MIB,
            checkpoints: 2 * MIB,
            templates: 7 * MIB,
            layers: 130 * MIB,
        }
    );
    assert_eq!(
        store.disk_bytes_of("t1").await.unwrap() as u64,
        sampled.total()
    );
    let allocated = store.disk_split_of("t1", true).await.unwrap();
    assert_eq!(allocated.sandboxes, 2 * 64 * MIB, "each disk at its size");
    assert_eq!(
        (allocated.checkpoints, allocated.templates, allocated.layers),
        (2 * MIB, 7 * MIB, 130 * MIB)
    );
    assert_eq!(
        store.allocated_disk_of("t1").await.unwrap() as u64,
        allocated.total()
    );
    assert_eq!(
        store.disk_split_of("t2", true).await.unwrap(),
        DiskSplit::default(),
        "another tenant holds nothing"
    );
}

#[tokio::test]
async fn layer_rows_live_and_go_with_their_image() {
    let (_dir, store) = temp_store().await;
    two_images(&store).await;
    // A second insert of the name is refused and leaves the first's layers.
    let dup = store
        .insert_image_with_layers(&oci("a"), &[layer("other", 1)])
        .await;
    assert!(
        matches!(dup, Err(crate::error::CoreError::Conflict(_))),
        "{dup:?}"
    );
    assert_eq!(
        store.image_layers("a").await.unwrap(),
        vec![layer("atop", 10 * MIB), layer("base", 100 * MIB)]
    );
    // Sizes measured once per digest are found again for the next image that has it.
    let known = store
        .known_layer_bytes(&["sha256:base".into(), "sha256:new".into()])
        .await
        .unwrap();
    assert_eq!(known.len(), 1);
    assert_eq!(known["sha256:base"], 100 * MIB);

    // Re-pointing: refused while a sandbox uses it (layers unchanged), then replaced.
    sandbox(&store, "sb-1", "t1", "a").await;
    assert!(!store
        .repoint_unused_image_with_layers("a", "/records/a2.json", &[layer("c", 1)])
        .await
        .unwrap());
    assert_eq!(store.layer_bytes_of("t1").await.unwrap(), 110 * MIB);
    store.delete_sandbox("sb-1").await.unwrap();
    assert!(store
        .repoint_unused_image_with_layers("a", "/records/a2.json", &[layer("c", MIB)])
        .await
        .unwrap());
    assert_eq!(
        store.image_layers("a").await.unwrap(),
        vec![layer("c", MIB)]
    );

    // Deleting the image row deletes its layer rows (the trigger), not another image's.
    assert!(store.delete_unused_image("a").await.unwrap());
    assert!(store.image_layers("a").await.unwrap().is_empty());
    assert_eq!(store.image_layers("b").await.unwrap().len(), 2);

    // The start's backfill: an image catalogued without layer rows is listed, filled,
    // and a row that went meanwhile gets none.
    store.insert_image(&oci("old")).await.unwrap();
    assert_eq!(
        store.images_without_layers("oci").await.unwrap(),
        vec!["old".to_string()]
    );
    store
        .set_image_layers("old", &[layer("base", 100 * MIB)])
        .await
        .unwrap();
    assert!(store.images_without_layers("oci").await.unwrap().is_empty());
    store
        .set_image_layers("gone", &[layer("base", 100 * MIB)])
        .await
        .unwrap();
    assert!(store.image_layers("gone").await.unwrap().is_empty());
}
