#![no_main]
//! `cargo fuzz run proto_decoder` (see docs/security.md); the body is shared with the stable
//! smoke run in CI.

mod body {
    include!("../bodies/proto_decoder.rs");
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
