#![no_main]
//! `cargo fuzz run path_resolver` (see docs/security.md); the body is shared with the stable
//! smoke run in CI.

mod body {
    include!("../bodies/path_resolver.rs");
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
