#![no_main]
//! `cargo fuzz run api_json` (see docs/security.md); the body is shared with the stable
//! smoke run in CI.

mod body {
    include!("../bodies/api_json.rs");
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
