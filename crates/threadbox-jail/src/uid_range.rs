//! Host uid ranges: which part of the host's uid space a daemon's sandboxes map onto.
//!
//! A sandbox's user namespace maps its uids onto `base + slot·65536 ..`; two daemons on one
//! host (two roots) must never hand out the same host uids, or a sandbox of one could act
//! on files and cgroups of a same-slot sandbox of the other. Each root therefore owns one
//! *range* of [`SLOTS_PER_RANGE`] slots, recorded twice:
//!
//! - in the root (`<root>/uid-range`), so its sandboxes keep their uids for life;
//! - in a host-wide registry (`/var/lib/threadbox-uid-ranges` by default), one line per
//!   claimed range, updated under an exclusive lock. A line whose root no longer records
//!   that range (a deleted test root, say) is stale and its range free again.
//!
//! A daemon whose recorded range is claimed by another root refuses to start.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use threadbox_core::error::{CoreError, Result};
use threadbox_sys::jail::ID_RANGE;

/// The host-wide registry of claimed ranges.
pub const DEFAULT_REGISTRY: &str = "/var/lib/threadbox-uid-ranges";
/// First host uid of range 0: far above what distributions hand out in /etc/subuid
/// (100000..) and never 0.
pub const FIRST_UID: u32 = 1_000_000;
/// Sandboxes (alive or stopped, each holding a slot until deleted) one root may have: one
/// slot per sandbox index the store hands out.
pub const SLOTS_PER_RANGE: u32 = threadbox_core::store::MAX_SANDBOXES;
/// The file in a root that records its range.
pub const MARKER: &str = "uid-range";

/// One root's part of the host uid space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub index: u32,
}

impl UidRange {
    /// Ranges that fit below `u32::MAX` (uid -1 is "no uid").
    pub fn count() -> u32 {
        ((u32::MAX as u64 - FIRST_UID as u64) / (SLOTS_PER_RANGE as u64 * ID_RANGE as u64)) as u32
    }

    /// First host uid of the range.
    pub fn base(&self) -> u32 {
        // Checked by construction: `index < count()`.
        FIRST_UID + self.index * SLOTS_PER_RANGE * ID_RANGE
    }

    /// First host uid of `slot`'s sub-range, or an error past the range's end.
    pub fn slot_base(&self, slot: u32) -> Result<u32> {
        if slot >= SLOTS_PER_RANGE {
            return Err(CoreError::Conflict(format!(
                "uid slot {slot} is outside this daemon's range of {SLOTS_PER_RANGE} sandboxes"
            )));
        }
        slot.checked_mul(ID_RANGE)
            .and_then(|o| self.base().checked_add(o))
            .ok_or_else(|| CoreError::Internal(format!("uid arithmetic overflow at slot {slot}")))
    }
}

fn marker_index(root: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(root.join(MARKER)).ok()?;
    text.trim().strip_prefix("range ")?.trim().parse().ok()
}

fn parse(text: &str) -> BTreeMap<u32, PathBuf> {
    text.lines()
        .filter_map(|l| {
            let (i, p) = l.split_once(' ')?;
            Some((i.parse().ok()?, PathBuf::from(p)))
        })
        .collect()
}

/// Claims (or confirms) the range of `root` in `registry`. A root that has no range yet
/// gets range 0 when it already has sandboxes from before ranges existed (their uids were
/// range 0's), else the lowest free range.
pub fn claim(root: &Path, registry: &Path) -> Result<UidRange> {
    let root = root
        .canonicalize()
        .map_err(|e| CoreError::Internal(format!("resolve {}: {e}", root.display())))?;
    let lock_path = registry.with_extension("lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| CoreError::Internal(format!("open {}: {e}", lock_path.display())))?;
    lock.lock()
        .map_err(|e| CoreError::Internal(format!("lock {}: {e}", lock_path.display())))?;

    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(registry)
        .map_err(|e| CoreError::Internal(format!("open {}: {e}", registry.display())))?;
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|e| CoreError::Internal(format!("read {}: {e}", registry.display())))?;
    let mut claimed = parse(&text);
    // Stale lines: their root is gone or records another range.
    claimed.retain(|i, p| marker_index(p) == Some(*i));

    let index = match marker_index(&root) {
        Some(i) => {
            if i >= UidRange::count() {
                return Err(CoreError::Internal(format!(
                    "{}: range {i} does not exist",
                    root.join(MARKER).display()
                )));
            }
            if let Some(other) = claimed.get(&i).filter(|p| **p != root) {
                return Err(CoreError::Conflict(format!(
                    "this root's host uid range {i} is also claimed by the threadbox root {}: \
                     two daemons must not share host uids (see {})",
                    other.display(),
                    registry.display()
                )));
            }
            i
        }
        None => {
            let legacy = root.join("state.db").exists();
            let mine = claimed.iter().find(|(_, p)| **p == root).map(|(i, _)| *i);
            let pick = match (mine, legacy) {
                (Some(i), _) => Some(i),
                (None, true) => (!claimed.contains_key(&0)).then_some(0),
                (None, false) => (0..UidRange::count()).find(|i| !claimed.contains_key(i)),
            };
            let Some(i) = pick else {
                return Err(CoreError::Conflict(if legacy {
                    format!(
                        "this root's sandboxes use host uid range 0, which the threadbox root {} \
                         claims: two daemons must not share host uids",
                        claimed
                            .get(&0)
                            .map(|p| p.display().to_string())
                            .unwrap_or_default()
                    )
                } else {
                    format!(
                        "every host uid range is claimed ({} roots in {})",
                        claimed.len(),
                        registry.display()
                    )
                }));
            };
            // The root's record first: a crash before the registry is written leaves a
            // root that re-registers the same range at its next start.
            let marker = root.join(MARKER);
            let tmp = root.join(format!("{MARKER}.tmp"));
            std::fs::write(&tmp, format!("range {i}\n"))
                .and_then(|()| std::fs::rename(&tmp, &marker))
                .map_err(|e| CoreError::Internal(format!("write {}: {e}", marker.display())))?;
            i
        }
    };
    claimed.insert(index, root.clone());

    let mut out = String::new();
    for (i, p) in &claimed {
        out.push_str(&format!("{i} {}\n", p.display()));
    }
    file.set_len(0)
        .and_then(|()| file.seek(SeekFrom::Start(0)).map(|_| ()))
        .and_then(|()| file.write_all(out.as_bytes()))
        .and_then(|()| file.sync_all())
        .map_err(|e| CoreError::Internal(format!("write {}: {e}", registry.display())))?;
    Ok(UidRange { index })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_fit_and_never_overlap() {
        let n = UidRange::count();
        assert!(n >= 16, "{n} ranges");
        let last = UidRange { index: n - 1 };
        let end = last.base() as u64 + SLOTS_PER_RANGE as u64 * ID_RANGE as u64;
        assert!(end <= u32::MAX as u64);
        let a = UidRange { index: 0 };
        let b = UidRange { index: 1 };
        assert_eq!(
            a.slot_base(SLOTS_PER_RANGE - 1).unwrap() + ID_RANGE,
            b.base()
        );
        assert!(a.slot_base(SLOTS_PER_RANGE).is_err());
        assert!(last.slot_base(u32::MAX).is_err());
    }

    #[test]
    fn two_roots_get_two_ranges_and_a_copied_root_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let reg = dir.path().join("registry");
        let (r1, r2, r3) = (
            dir.path().join("r1"),
            dir.path().join("r2"),
            dir.path().join("r3"),
        );
        for r in [&r1, &r2, &r3] {
            std::fs::create_dir(r).unwrap();
        }
        let a = claim(&r1, &reg).unwrap();
        let b = claim(&r2, &reg).unwrap();
        assert_ne!(a, b);
        // Claiming again is stable.
        assert_eq!(claim(&r1, &reg).unwrap(), a);
        // A root that records r1's range (a copy of r1) must not start.
        std::fs::copy(r1.join(MARKER), r3.join(MARKER)).unwrap();
        assert!(matches!(claim(&r3, &reg), Err(CoreError::Conflict(_))));
        // Once r1 is gone its range is free for others.
        std::fs::remove_dir_all(&r1).unwrap();
        assert_eq!(claim(&r3, &reg).unwrap(), a);
        // A root with sandboxes from before ranges existed wants range 0, which r3 holds.
        let legacy = dir.path().join("legacy");
        std::fs::create_dir(&legacy).unwrap();
        std::fs::write(legacy.join("state.db"), b"").unwrap();
        let want0 = claim(&legacy, &reg);
        if a.index == 0 {
            assert!(matches!(want0, Err(CoreError::Conflict(_))), "{want0:?}");
        }
    }
}
