//! Secrets the sandbox never holds (issue 13 scope 4, ADR 0068).
//!
//! A tenant's secret is sealed with the daemon's key (`<root>/secrets/store.key`, 0600;
//! ChaCha20-Poly1305, the tenant and name as additional data) and stored as ciphertext only.
//! A sandbox created with `secrets: [NAME]` holds a random placeholder in env `NAME` (added
//! to every exec, process and context) and trusts the daemon's egress CA
//! (`<root>/secrets/ca-key.pem` stays on the host, 0600; the certificate is written into the
//! sandbox's CA bundle and named by `SSL_CERT_FILE` & co.). Its egress data plane intercepts
//! TLS for the secrets' hosts only and swaps the placeholder there (`threadbox-net::mitm`).
//! No operation answers a value.

use super::*;
use ring::aead::{self, LessSafeKey, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use threadbox_api::secrets::{
    DeleteSecret, ListSecrets, SecretInfo, SecretList, SetSecret, SetSecretRequest,
};
use threadbox_net::mitm::{Intercept, Mitm};
use threadbox_net::secrets::SecretSwap;

use crate::store_secrets::SecretRow;

/// Inside a sandbox with secrets: the CA alone, and the image's bundle plus the CA. Under
/// `/tmp` because the rest of the tree outside the home is owned by the host (unmapped,
/// so not writable even by the sandbox's root); a root-owned directory in the sticky
/// `/tmp` cannot be replaced by the sandbox's user, and it is written again at every boot.
pub const SANDBOX_CA_FILE: &str = "/tmp/.threadbox/egress-ca.pem";
pub const SANDBOX_BUNDLE_FILE: &str = "/tmp/.threadbox/ca-bundle.pem";
/// The image's own bundle (Debian layout), extended in place when present.
const IMAGE_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The host's roots, for verifying upstreams.
const HOST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
const MAX_VALUE: usize = 8 * 1024;

/// The daemon's secret keys: the sealing key and the interceptor (its CA).
pub(super) struct SecretState {
    key: LessSafeKey,
    rng: SystemRandom,
    mitm: Arc<Mitm>,
    ca_pem: String,
}

/// Reads `path`, or writes `make()` there first with mode `mode` (never replacing a file
/// that appeared meanwhile).
fn read_or_create(
    path: &Path,
    mode: u32,
    make: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    match std::fs::read(path) {
        Ok(b) => {
            // A key left readable by others is tightened, not trusted as it was.
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
            return Ok(b);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let bytes = make()?;
    let tmp = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4().simple()));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    // A hard link fails if another process made the file first: then theirs wins.
    let r = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match r {
        Ok(()) => Ok(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(std::fs::read(path)?),
        Err(e) => Err(e.into()),
    }
}

fn internal(e: impl std::fmt::Display) -> CoreError {
    CoreError::Internal(e.to_string())
}

impl SecretState {
    /// Loads (or makes, on first start) the keys under `<root>/secrets`. `extra_roots`:
    /// PEM files of CAs upstreams may also be signed by (`serve --egress-upstream-ca`).
    pub(super) fn open(root: &Path, extra_roots: &[PathBuf]) -> Result<SecretState> {
        let dir = root.join("secrets");
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let rng = SystemRandom::new();
        let raw = read_or_create(&dir.join("store.key"), 0o600, || {
            let mut k = vec![0u8; 32];
            rng.fill(&mut k).map_err(|_| internal("no randomness"))?;
            Ok(k)
        })?;
        let key = UnboundKey::new(&CHACHA20_POLY1305, &raw)
            .map_err(|_| internal("secrets/store.key is not a 32-byte key"))?;
        let mut ca_made = None;
        let ca_key = read_or_create(&dir.join("ca-key.pem"), 0o600, || {
            let (cert, key) = threadbox_net::mitm::generate_ca().map_err(internal)?;
            ca_made = Some(cert);
            Ok(key.into_bytes())
        })?;
        let ca_key = String::from_utf8(ca_key).map_err(internal)?;
        let ca_path = dir.join("ca.pem");
        let ca_pem = match (std::fs::read_to_string(&ca_path), ca_made) {
            (_, Some(made)) => {
                std::fs::write(&ca_path, &made)?;
                std::fs::set_permissions(&ca_path, std::fs::Permissions::from_mode(0o644))?;
                made
            }
            (Ok(pem), None) if !pem.trim().is_empty() => pem,
            _ => {
                return Err(internal(
                    "secrets/ca.pem is missing or empty while ca-key.pem exists: remove both \
                     to make a new CA (sandboxes with secrets then need a restart)",
                ))
            }
        };
        let mut roots = Vec::new();
        for p in std::iter::once(&PathBuf::from(HOST_BUNDLE)).chain(extra_roots) {
            match std::fs::read(p) {
                Ok(pem) => {
                    roots.extend(threadbox_net::mitm::certs_from_pem(&pem).map_err(internal)?)
                }
                // The host has no bundle: only the operator's extra roots verify upstreams.
                Err(e)
                    if e.kind() == std::io::ErrorKind::NotFound && p == Path::new(HOST_BUNDLE) => {}
                Err(e) => return Err(internal(format!("upstream CA {}: {e}", p.display()))),
            }
        }
        let mitm = Mitm::new(&ca_key, &roots).map_err(internal)?;
        Ok(SecretState {
            key: LessSafeKey::new(key),
            rng,
            mitm: Arc::new(mitm),
            ca_pem,
        })
    }

    fn aad(tenant: &str, name: &str) -> Vec<u8> {
        [tenant.as_bytes(), b"\0", name.as_bytes()].concat()
    }

    fn seal(&self, tenant: &str, name: &str, value: &str) -> Result<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .map_err(|_| internal("no randomness"))?;
        let mut data = value.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::from(Self::aad(tenant, name)),
                &mut data,
            )
            .map_err(|_| internal("sealing failed"))?;
        Ok([&nonce[..], &data].concat())
    }

    fn open_value(&self, row: &SecretRow) -> Result<String> {
        if row.sealed.len() < NONCE_LEN {
            return Err(internal(format!("secret {} is damaged", row.name)));
        }
        let (n, c) = row.sealed.split_at(NONCE_LEN);
        let nonce = aead::Nonce::try_assume_unique_for_key(n).map_err(|_| internal("nonce"))?;
        let mut data = c.to_vec();
        let plain = self
            .key
            .open_in_place(
                nonce,
                aead::Aad::from(Self::aad(&row.tenant, &row.name)),
                &mut data,
            )
            .map_err(|_| {
                internal(format!(
                    "secret {} does not open with this daemon's key",
                    row.name
                ))
            })?;
        String::from_utf8(plain.to_vec()).map_err(internal)
    }
}

/// A random placeholder: recognisable, and nothing like the value.
fn placeholder(rng: &SystemRandom) -> Result<String> {
    let mut b = [0u8; 16];
    rng.fill(&mut b).map_err(|_| internal("no randomness"))?;
    Ok(format!("tb_secret_{}", hex::encode(b)))
}

fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(CoreError::InvalidArgument(format!(
            "secret name {name:?} must be an environment variable name: letters, digits and `_`, \
             not starting with a digit, at most 64 bytes"
        )))
    }
}

/// The checked (host, header, format) of a request.
fn check_request(req: &SetSecretRequest) -> Result<(String, String, String)> {
    let bad = |m: String| CoreError::InvalidArgument(m);
    if req.host.contains('*') || req.host.parse::<std::net::IpAddr>().is_ok() {
        return Err(bad(format!(
            "secret host {:?} must be one exact DNS name (no wildcard, no IP address)",
            req.host
        )));
    }
    let host = threadbox_net::policy::normalize_name(&req.host)
        .map_err(|e| bad(format!("secret host {:?}: {e}", req.host)))?;
    let header = req.header.clone().unwrap_or_else(|| "Authorization".into());
    let token = !header.is_empty()
        && header.len() <= 64
        && header
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !token {
        return Err(bad(format!("header {header:?} is not a header name")));
    }
    let lower = header.to_ascii_lowercase();
    if [
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "upgrade",
    ]
    .contains(&lower.as_str())
    {
        return Err(bad(format!(
            "header {header:?} cannot carry a secret (it frames the request)"
        )));
    }
    let format = req.format.clone().unwrap_or_else(|| "{}".into());
    if format.matches("{}").count() != 1
        || format.len() > 256
        || format.bytes().any(|b| b < 0x20 || b == 0x7f)
    {
        return Err(bad(format!(
            "format {format:?} must hold `{{}}` once and no control characters"
        )));
    }
    if req.value.is_empty() || req.value.len() > MAX_VALUE {
        return Err(bad(format!(
            "a secret's value must be 1 to {MAX_VALUE} bytes"
        )));
    }
    // A value goes into a header: CR, LF or NUL would let it write other headers.
    if req
        .value
        .bytes()
        .any(|b| b < 0x20 && b != b'\t' || b == 0x7f)
    {
        return Err(bad(
            "a secret's value cannot hold control characters (CR, LF, NUL...)".into(),
        ));
    }
    Ok((host, header, format))
}

fn info(row: &SecretRow) -> SecretInfo {
    SecretInfo {
        name: row.name.clone(),
        host: row.host.clone(),
        header: row.header.clone(),
        format: row.format.clone(),
        updated_at: rfc3339(row.updated_at),
    }
}

impl Manager {
    pub async fn set_secret(&self, caller: &Caller, op: SetSecret) -> Result<SecretInfo> {
        let r = async {
            caller.require(SetSecret::SCOPE)?;
            check_name(&op.name)?;
            let (host, header, format) = check_request(&op.req)?;
            let sealed = self.secrets.seal(&caller.tenant, &op.name, &op.req.value)?;
            let row = SecretRow {
                tenant: caller.tenant.clone(),
                name: op.name.clone(),
                host,
                header,
                format,
                sealed,
                updated_at: now_ms(),
            };
            self.store.put_secret(&row).await?;
            self.refresh_intercepts(&caller.tenant, &op.name).await;
            Ok(info(&row))
        }
        .await;
        self.audit(caller, SetSecret::NAME, &op.name, &r).await;
        r
    }

    pub async fn list_secrets(&self, caller: &Caller, _op: ListSecrets) -> Result<SecretList> {
        caller.require(ListSecrets::SCOPE)?;
        let rows = self.store.list_secrets(&caller.tenant).await?;
        Ok(SecretList {
            secrets: rows.iter().map(info).collect(),
        })
    }

    pub async fn delete_secret(&self, caller: &Caller, op: DeleteSecret) -> Result<()> {
        let r = async {
            caller.require(DeleteSecret::SCOPE)?;
            if !self.store.delete_secret(&caller.tenant, &op.name).await? {
                return Err(CoreError::NotFound(format!("secret {}", op.name)));
            }
            self.refresh_intercepts(&caller.tenant, &op.name).await;
            Ok(())
        }
        .await;
        self.audit(caller, DeleteSecret::NAME, &op.name, &r).await;
        r
    }

    /// Refused before anything is created: a name the tenant has no secret of.
    pub(super) async fn check_create_secrets(
        &self,
        caller: &Caller,
        names: &[String],
    ) -> Result<()> {
        for n in names {
            check_name(n)?;
            if self.store.get_secret(&caller.tenant, n).await?.is_none() {
                return Err(CoreError::InvalidArgument(format!(
                    "secret {n:?} does not exist (threadbox secret set {n} --host ...)"
                )));
            }
        }
        Ok(())
    }

    /// The agent connection of `id`, when it has one.
    pub(super) fn conn_of(&self, id: &str) -> Option<Arc<AgentConn>> {
        let live = self.live(id);
        let c = live.conn.lock().unwrap_or_else(|p| p.into_inner()).clone();
        c
    }

    /// Gives sandbox `id` a fresh placeholder for each of `names`.
    pub(super) async fn bind_secrets(&self, id: &str, names: &[String]) -> Result<()> {
        for n in names {
            let p = placeholder(&self.secrets.rng)?;
            self.store.put_sandbox_secret(id, n, &p).await?;
        }
        Ok(())
    }

    /// The environment a sandbox with secrets adds to each command: the placeholders and
    /// the CA variables. A variable the request sets itself wins.
    pub(super) async fn secret_env(
        &self,
        id: &str,
        env: &mut BTreeMap<String, String>,
    ) -> Result<()> {
        let bound = self.store.sandbox_secrets(id).await?;
        if bound.is_empty() {
            return Ok(());
        }
        for (name, p) in bound {
            env.entry(name).or_insert(p);
        }
        for var in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "PIP_CERT",
            "GIT_SSL_CAINFO",
            "CURL_CA_BUNDLE",
        ] {
            env.entry(var.into())
                .or_insert_with(|| SANDBOX_BUNDLE_FILE.into());
        }
        env.entry("NODE_EXTRA_CA_CERTS".into())
            .or_insert_with(|| SANDBOX_CA_FILE.into());
        Ok(())
    }

    /// The CA sandbox `id` trusts through its image's bundle (it has secrets), if any.
    pub(super) async fn secret_ca_of(&self, id: &str) -> Result<Option<String>> {
        let bound = self.store.sandbox_secrets(id).await?;
        Ok((!bound.is_empty()).then(|| self.secrets.ca_pem.clone()))
    }

    /// Writes the CA into a sandbox with secrets (after boot, start, adoption): the CA
    /// alone, a bundle of the image's roots plus it, and the image's own bundle extended.
    pub(super) async fn install_secret_ca(&self, id: &str, conn: &AgentConn) -> Result<()> {
        if self.store.sandbox_secrets(id).await?.is_empty() {
            return Ok(());
        }
        let ca = self.secrets.ca_pem.clone();
        let image_bundle = match conn
            .call(proto::Request::FileRead {
                path: IMAGE_BUNDLE.into(),
                user: proto::RunAs::Root,
                offset: 0,
                limit: Some(16 << 20),
            })
            .await
        {
            Ok(proto::Response::FileData { data, .. }) => Some(data),
            _ => None,
        };
        let mut bundle = image_bundle.clone().unwrap_or_default();
        let has_ca = |b: &[u8]| b.windows(ca.len()).any(|w| w == ca.as_bytes());
        if !has_ca(&bundle) {
            if !bundle.is_empty() && !bundle.ends_with(b"\n") {
                bundle.push(b'\n');
            }
            bundle.extend_from_slice(ca.as_bytes());
        }
        let extend_image = image_bundle.as_deref().is_some_and(|b| !has_ca(b));
        let mut writes = vec![
            (SANDBOX_CA_FILE, ca.as_bytes().to_vec(), true),
            (SANDBOX_BUNDLE_FILE, bundle.clone(), true),
        ];
        if extend_image {
            // Only where the image lets the sandbox's root write it (not the host image,
            // whose /etc belongs to the host): the env variables cover the rest.
            writes.push((IMAGE_BUNDLE, bundle, false));
        }
        for (path, data, required) in writes {
            match conn
                .call(proto::Request::FileWrite {
                    path: path.into(),
                    user: proto::RunAs::Root,
                    data,
                    append: false,
                    mode: Some(0o644),
                    make_parents: true,
                })
                .await
            {
                Ok(proto::Response::Done) => {}
                Ok(other) if required => return Err(unexpected(other)),
                Err(e) if required => return Err(e),
                Ok(_) | Err(_) => {
                    tracing::debug!(sandbox = %id, "secrets: {path} is not writable; the CA is trusted through the env variables");
                }
            }
        }
        Ok(())
    }

    /// The interception for sandbox `id` (its secrets that still exist), or `None`.
    pub(super) async fn intercept_of(&self, id: &str, tenant: &str) -> Result<Option<Intercept>> {
        let bound = self.store.sandbox_secrets(id).await?;
        let mut swaps = Vec::new();
        for (name, placeholder) in bound {
            let Some(row) = self.store.get_secret(tenant, &name).await? else {
                continue;
            };
            swaps.push(SecretSwap {
                value: self.secrets.open_value(&row)?,
                name,
                host: row.host,
                header: row.header,
                format: row.format,
                placeholder,
            });
        }
        #[cfg(feature = "insecure-test-hooks")]
        let any_host =
            threadbox_sys::testhooks::Weaken::from_env().is_ok_and(|w| w.has("secrets-any-host"));
        #[cfg(not(feature = "insecure-test-hooks"))]
        let any_host = false;
        #[cfg(feature = "insecure-test-hooks")]
        let host_switch = threadbox_sys::testhooks::Weaken::from_env()
            .is_ok_and(|w| w.has("secrets-host-switch"));
        #[cfg(not(feature = "insecure-test-hooks"))]
        let host_switch = false;
        Ok((!swaps.is_empty()).then(|| Intercept {
            mitm: self.secrets.mitm.clone(),
            swaps: Arc::new(swaps),
            any_host,
            host_switch,
        }))
    }

    /// A secret changed or went: the running sandboxes holding it get the new set.
    async fn refresh_intercepts(&self, tenant: &str, name: &str) {
        let ids = match self.store.sandboxes_with_secret(tenant, name).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!("secrets: could not list the sandboxes using {name}: {e}");
                return;
            }
        };
        for id in ids {
            if let Some(net) = self.attached_net(&id) {
                match self.intercept_of(&id, tenant).await {
                    Ok(i) => net.set_intercept(i),
                    Err(e) => tracing::warn!(sandbox = %id, "secrets: {e}"),
                }
            }
        }
    }
}

impl crate::ops::Run for SetSecret {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<SecretInfo> {
        m.set_secret(caller, self).await
    }
}

impl crate::ops::Run for ListSecrets {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<SecretList> {
        m.list_secrets(caller, self).await
    }
}

impl crate::ops::Run for DeleteSecret {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<()> {
        m.delete_secret(caller, self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_for_their_row_and_never_hold_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let s = SecretState::open(dir.path(), &[]).unwrap();
        let sealed = s.seal("t1", "API_KEY", "sk-live-123").unwrap();
        assert!(!sealed.windows(11).any(|w| w == b"sk-live-123"));
        let mut row = SecretRow {
            tenant: "t1".into(),
            name: "API_KEY".into(),
            host: "api.test".into(),
            header: "Authorization".into(),
            format: "{}".into(),
            sealed,
            updated_at: 0,
        };
        assert_eq!(s.open_value(&row).unwrap(), "sk-live-123");
        // Moved to another tenant's row, it does not open.
        row.tenant = "t2".into();
        assert!(s.open_value(&row).is_err());
        let mode = |p: &str| {
            std::fs::metadata(dir.path().join("secrets").join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("store.key"), 0o600);
        assert_eq!(mode("ca-key.pem"), 0o600);
        // Reopened: the same keys.
        let s2 = SecretState::open(dir.path(), &[]).unwrap();
        row.tenant = "t1".into();
        assert_eq!(s2.open_value(&row).unwrap(), "sk-live-123");
        assert_eq!(s2.ca_pem, s.ca_pem);
    }

    #[test]
    fn bad_requests_are_refused_with_a_sentence() {
        let ok = SetSecretRequest {
            host: "api.example.com".into(),
            value: "v".into(),
            ..Default::default()
        };
        assert!(check_request(&ok).is_ok());
        for bad in [
            SetSecretRequest {
                host: "*.example.com".into(),
                ..ok.clone()
            },
            SetSecretRequest {
                host: "10.0.0.1".into(),
                ..ok.clone()
            },
            SetSecretRequest {
                header: Some("Host".into()),
                ..ok.clone()
            },
            SetSecretRequest {
                header: Some("X: y".into()),
                ..ok.clone()
            },
            SetSecretRequest {
                format: Some("Bearer".into()),
                ..ok.clone()
            },
            SetSecretRequest {
                value: "a\r\nX-Evil: 1".into(),
                ..ok.clone()
            },
            SetSecretRequest {
                value: String::new(),
                ..ok.clone()
            },
        ] {
            assert!(
                matches!(check_request(&bad), Err(CoreError::InvalidArgument(_))),
                "{bad:?}"
            );
        }
        assert!(check_name("1ABC").is_err());
        assert!(check_name("A-B").is_err());
        assert!(check_name("OPENAI_API_KEY").is_ok());
    }
}
