//! Test-only weakenings (`--test-weaken`, only with the `insecure-test-hooks` feature):
//! the positive controls of the security suite. Without the feature, [`has`] is a constant
//! `false` and the argument does not exist.

#[cfg(feature = "insecure-test-hooks")]
static WEAKEN: std::sync::OnceLock<threadbox_sys::testhooks::Weaken> = std::sync::OnceLock::new();

/// Records the weakenings given on the command line (once).
#[cfg(feature = "insecure-test-hooks")]
pub fn set(list: &str) -> Result<(), String> {
    let w = threadbox_sys::testhooks::Weaken::parse(list)?;
    crate::log(&format!("INSECURE TEST BUILD: weakened by {list}"));
    WEAKEN
        .set(w)
        .map_err(|_| "--test-weaken given twice".to_string())
}

/// The weakenings in force.
#[cfg(feature = "insecure-test-hooks")]
pub fn get() -> threadbox_sys::testhooks::Weaken {
    WEAKEN.get().cloned().unwrap_or_default()
}

/// Whether weakening `w` is in force.
#[cfg(feature = "insecure-test-hooks")]
pub fn has(w: &str) -> bool {
    WEAKEN.get().is_some_and(|x| x.has(w))
}

/// The weakenings in force: none, in this build (threadbox-sys may still have the
/// feature through another crate; its `Weaken` is then empty).
#[cfg(not(feature = "insecure-test-hooks"))]
pub fn get() -> threadbox_sys::child::Weaken {
    Default::default()
}

/// Whether weakening `w` is in force: never, in this build.
#[cfg(not(feature = "insecure-test-hooks"))]
pub fn has(_w: &str) -> bool {
    false
}
