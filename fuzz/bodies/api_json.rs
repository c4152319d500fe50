// Fuzz body shared by cargo fuzz and the stable smoke run: any bytes given to the API's
// JSON request types either fail to parse or parse into a value that serializes and
// parses back to the same value; nothing panics.
pub fn run(data: &[u8]) {
    fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(data: &[u8]) {
        if let Ok(v) = serde_json::from_slice::<T>(data) {
            let json = serde_json::to_value(&v).expect("serializes");
            let back: T = serde_json::from_value(json.clone()).expect("parses back");
            assert_eq!(serde_json::to_value(&back).expect("serializes"), json);
        }
    }
    round_trip::<threadbox_api::CreateSandboxRequest>(data);
    round_trip::<threadbox_api::ExecRequest>(data);
    round_trip::<threadbox_api::StartProcessRequest>(data);
    round_trip::<threadbox_api::LimitsRequest>(data);
}
