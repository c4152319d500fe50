//! The committed `api/openapi.json` must be exactly what the code generates.

#[test]
fn committed_openapi_document_is_fresh() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../api/openapi.json");
    let generated = threadbox_server::openapi_json();
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "api/openapi.json is stale or missing; regenerate it from the repository root with:\n\
         \n    cargo run -p threadbox -- openapi > api/openapi.json\n"
    );
}
