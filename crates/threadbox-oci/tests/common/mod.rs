//! A local registry for tests: Debian's `docker-registry` on a free loopback port with its
//! storage in a temp dir, `skopeo` to push layouts into it, and an auth proxy in front of
//! it (basic, or bearer with a token service) so the challenge flows run against a real
//! registry. Nothing leaves loopback.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn need(bin: &str) {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{bin} is missing: scripts/test.sh installs it (apt-get install docker-registry skopeo)"
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

pub struct LocalRegistry {
    child: Child,
    pub addr: SocketAddr,
    pub storage: PathBuf,
    _dir: tempfile::TempDir,
}

impl LocalRegistry {
    pub fn start() -> LocalRegistry {
        need("docker-registry");
        let dir = tempfile::tempdir().unwrap();
        let storage = dir.path().join("storage");
        std::fs::create_dir_all(&storage).unwrap();
        let port = free_port();
        let cfg = dir.path().join("config.yml");
        std::fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
                storage.display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .args(["serve", cfg.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut s) = TcpStream::connect(addr) {
                let _ = s.write_all(b"GET /v2/ HTTP/1.0\r\n\r\n");
                let mut b = String::new();
                let _ = s.read_to_string(&mut b);
                if b.starts_with("HTTP/1.0 200") || b.starts_with("HTTP/1.1 200") {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "docker-registry did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        LocalRegistry {
            child,
            addr,
            storage,
            _dir: dir,
        }
    }

    pub fn host(&self) -> String {
        format!("localhost:{}", self.addr.port())
    }

    /// The stored file of blob `hex`.
    pub fn blob_file(&self, hex: &str) -> PathBuf {
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `skopeo copy oci:<layout>:<tag> docker://<dest>` (`all`: an index with every image;
/// `v2s2`: converted to Docker v2 manifests).
pub fn push(layout: &Path, tag: &str, dest: &str, all: bool, v2s2: bool) {
    need("skopeo");
    let mut c = Command::new("skopeo");
    c.args([
        "copy",
        "--quiet",
        "--dest-tls-verify=false",
        "--insecure-policy",
    ]);
    if all {
        c.arg("--all");
    }
    if v2s2 {
        c.args(["--format", "v2s2"]);
    }
    c.arg(format!("oci:{}:{tag}", layout.display()));
    c.arg(format!("docker://{dest}"));
    let out = c.output().expect("skopeo");
    assert!(
        out.status.success(),
        "skopeo copy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// How the proxy guards the registry.
#[derive(Clone)]
pub enum Guard {
    Basic {
        user: String,
        pass: String,
    },
    /// `/token` hands out `token` for these credentials; `/v2/` wants `Bearer token`.
    Bearer {
        user: String,
        pass: String,
        token: String,
    },
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A thread-per-connection HTTP/1.1 proxy in front of `upstream`: checks the request's
/// `Authorization` against `guard`, answers 401 with a challenge otherwise, forwards
/// with `Connection: close` and pipes the answer back. Also the bearer token service.
pub struct AuthProxy {
    pub addr: SocketAddr,
    pub tokens_issued: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl AuthProxy {
    pub fn start(upstream: SocketAddr, guard: Guard) -> AuthProxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let issued = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let iss = issued.clone();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let g = guard.clone();
                let iss = iss.clone();
                std::thread::spawn(move || {
                    let _ = serve(s, upstream, addr, &g, &iss);
                });
            }
        });
        AuthProxy {
            addr,
            tokens_issued: issued,
        }
    }
}

fn read_head(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.push(b[0]);
        if head.len() > 64 << 10 {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
    }
    Ok(head)
}

fn serve(
    mut s: TcpStream,
    upstream: SocketAddr,
    me: SocketAddr,
    guard: &Guard,
    issued: &std::sync::atomic::AtomicUsize,
) -> std::io::Result<()> {
    loop {
        let head = read_head(&mut s)?;
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut lines = text.split("\r\n");
        let first = lines.next().unwrap_or("").to_string();
        let path = first.split(' ').nth(1).unwrap_or("/").to_string();
        let auth = lines
            .clone()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("authorization")
                    .then(|| v.trim().to_string())
            })
            .unwrap_or_default();
        let reply = |s: &mut TcpStream, status: &str, extra: &str, body: &str| {
            write!(
                s,
                "HTTP/1.1 {status}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        };
        match guard {
            Guard::Bearer { user, pass, token } if path.starts_with("/token") => {
                if auth == format!("Basic {}", b64(&format!("{user}:{pass}"))) {
                    issued.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    reply(&mut s, "200 OK", "", &format!("{{\"token\":\"{token}\"}}"))?;
                } else {
                    reply(&mut s, "401 Unauthorized", "", "{}")?;
                }
                continue;
            }
            Guard::Bearer { token, .. } if auth != format!("Bearer {token}") => {
                let ch = format!(
                    "WWW-Authenticate: Bearer realm=\"http://{me}/token\",service=\"test-registry\",scope=\"repository:guarded:pull\"\r\n"
                );
                reply(&mut s, "401 Unauthorized", &ch, "{}")?;
                continue;
            }
            Guard::Basic { user, pass }
                if auth != format!("Basic {}", b64(&format!("{user}:{pass}"))) =>
            {
                reply(
                    &mut s,
                    "401 Unauthorized",
                    "WWW-Authenticate: Basic realm=\"test\"\r\n",
                    "{}",
                )?;
                continue;
            }
            _ => {}
        }
        // Forward (GET and HEAD only: the client under test only reads).
        let mut up = TcpStream::connect(upstream)?;
        let mut fwd = String::new();
        fwd.push_str(&first);
        fwd.push_str("\r\n");
        for l in text.split("\r\n").skip(1) {
            if l.is_empty() {
                continue;
            }
            let k = l.split(':').next().unwrap_or("").to_ascii_lowercase();
            if k == "connection" || k == "authorization" {
                continue;
            }
            fwd.push_str(l);
            fwd.push_str("\r\n");
        }
        fwd.push_str("Connection: close\r\n\r\n");
        up.write_all(fwd.as_bytes())?;
        // The answer, with `Connection: close` so the client opens a new connection.
        let mut resp = Vec::new();
        up.read_to_end(&mut resp)?;
        let cut = resp
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|p| p + 4)
            .unwrap_or(resp.len());
        let rhead = String::from_utf8_lossy(&resp[..cut]).replace("\r\nConnection: close", "");
        let rhead = rhead.replacen("\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1);
        s.write_all(rhead.as_bytes())?;
        s.write_all(&resp[cut..])?;
        return Ok(());
    }
}
