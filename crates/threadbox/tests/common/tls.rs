//! The test CA of the HTTPS upstreams (shared by `upstream.rs` and the security suite).

/// A test CA and a certificate it signs for `*.test` (and `api.test`, `other.test`), for
/// the HTTPS server of `upstream.py`.
pub fn write_tls(dir: &std::path::Path) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.distinguished_name
        .push(DnType::CommonName, "threadbox test upstream CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).expect("CA cert");
    let key = KeyPair::generate().expect("leaf key");
    let names = ["api.test", "other.test", "*.test"]
        .map(String::from)
        .to_vec();
    let leaf = CertificateParams::new(names)
        .expect("leaf params")
        .signed_by(&key, &ca, &ca_key)
        .expect("leaf cert");
    std::fs::write(dir.join("tls-ca.pem"), ca.pem()).expect("write CA");
    std::fs::write(dir.join("tls-cert.pem"), leaf.pem()).expect("write cert");
    std::fs::write(dir.join("tls-key.pem"), key.serialize_pem()).expect("write key");
}
