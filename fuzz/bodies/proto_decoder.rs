// Fuzz body shared by `fuzz/fuzz_targets/proto_decoder.rs` (cargo fuzz) and the stable
// smoke run in `crates/threadbox/tests/fuzz_smoke.rs`: arbitrary bytes, fed in arbitrary
// chunks, never panic the host↔agent frame decoder, never make it buffer more than one
// maximal frame, and every frame it yields re-encodes to a frame that decodes the same.
pub fn run(data: &[u8]) {
    use threadbox_proto::{codec, MAX_FRAME};
    let mut dec = codec::FrameDecoder::new();
    // The first byte picks a chunk size, so frame boundaries fall everywhere.
    let chunk = data.first().map(|b| *b as usize + 1).unwrap_or(1);
    for part in data.chunks(chunk) {
        dec.feed(part);
        loop {
            match dec.next_frame() {
                Ok(Some(frame)) => {
                    // Re-encoding may only fail by size (JSON can grow when re-printed).
                    let Ok(bytes) = codec::encode_frame(&frame) else {
                        continue;
                    };
                    assert!(bytes.len() <= MAX_FRAME + 4);
                    let again = codec::decode_frame(&bytes[4..]).expect("and decodes again");
                    assert_eq!(
                        serde_json::to_value(&again).ok(),
                        serde_json::to_value(&frame).ok()
                    );
                }
                Ok(None) => break,
                // A refused frame ends the stream, as the agent and daemon do.
                Err(_) => return,
            }
        }
    }
}
