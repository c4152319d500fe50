//! Governance end to end against a real daemon: API keys and scopes on TCP, tenants,
//! quotas and the daily CPU cap, metering, the audit log's hash chain (tampered with
//! directly in the store), and keys never reaching the daemon's log.

mod common;

use common::{require_root, serial, wait_for, Daemon, Run};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

/// One HTTP/1.1 request over TCP; returns the status and the body.
fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the daemon");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
    let body = match text.find("\r\n\r\n") {
        Some(i) => dechunk(
            &text[i + 4..],
            text[..i].to_ascii_lowercase().contains("chunked"),
        ),
        None => String::new(),
    };
    (status, body)
}

fn dechunk(body: &str, chunked: bool) -> String {
    if !chunked {
        return body.to_string();
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some(i) = rest.find("\r\n") {
        let n = usize::from_str_radix(rest[..i].trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[i + 2..i + 2 + n]);
        rest = &rest[i + 2 + n + 2..];
    }
    out
}

/// A client with an API key (or none) on the daemon's TCP port.
struct Tcp<'a> {
    port: u16,
    key: Option<&'a str>,
}

impl Tcp<'_> {
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let auth = self.key.map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("Authorization", a)])
            .unwrap_or_default();
        let (status, text) = http(self.port, method, path, &headers, body);
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, v)
    }
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

/// Runs the CLI on TCP with `THREADBOX_API_KEY=key`.
fn cli_with_key(d: &Daemon, key: &str, args: &[&str]) -> Run {
    Command::new(common::threadbox_bin())
        .args(args)
        .env("THREADBOX_URL", format!("http://127.0.0.1:{}", d.port))
        .env("THREADBOX_API_KEY", key)
        .stdin(Stdio::null())
        .output()
        .expect("run threadbox")
        .into()
}

fn create_key(d: &Daemon, tenant: &str, scopes: &[&str], extra: &[&str]) -> (String, String) {
    let mut args = vec!["keys", "create", "--tenant", tenant, "--json"];
    for s in scopes {
        args.extend(["--scope", s]);
    }
    args.extend_from_slice(extra);
    let v = d.cli(&args).ok().json();
    assert_eq!(v["tenant"], tenant);
    let key = v["key"].as_str().unwrap().to_string();
    assert!(
        key.len() >= 43,
        "a key carries at least 256 random bits: {key}"
    );
    (v["id"].as_str().unwrap().to_string(), key)
}

/// Deletes the sandboxes of `tenants` when dropped (also when a test fails), through the
/// operator's socket acting for each tenant: sandboxes outlive the daemon by design.
struct Cleanup<'a> {
    d: &'a Daemon,
    tenants: &'a [&'a str],
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for t in self.tenants {
            let tb = |args: &[&str]| -> Run {
                Command::new(common::threadbox_bin())
                    .args(args)
                    .env("THREADBOX_URL", &self.d.url)
                    .env("THREADBOX_TENANT", t)
                    .env_remove("THREADBOX_API_KEY")
                    .stdin(Stdio::null())
                    .output()
                    .expect("run threadbox")
                    .into()
            };
            let list = tb(&["ls", "--json"]);
            if list.code != 0 {
                continue;
            }
            if let Ok(v) = serde_json::from_slice::<Value>(&list.stdout) {
                for sb in v["sandboxes"].as_array().into_iter().flatten() {
                    if let Some(id) = sb["id"].as_str() {
                        let _ = tb(&["rm", "--force", id]);
                    }
                }
            }
        }
    }
}

fn sql(db: &std::path::Path, statements: &[&str]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use sqlx::ConnectOptions;
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(db)
            .busy_timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("open state.db");
        for st in statements {
            sqlx::query(st).execute(&mut conn).await.expect(st);
        }
    });
}

#[test]
fn keys_scopes_and_tenants() {
    if !require_root("keys_scopes_and_tenants") {
        return;
    }
    let _serial = serial();
    let d = Daemon::start();
    let _cleanup = Cleanup {
        d: &d,
        tenants: &["acme", "beta"],
    };
    let mut keys = Vec::new();

    // Missing, malformed, unknown keys.
    let anon = Tcp {
        port: d.port,
        key: None,
    };
    let (s, v) = anon.call("GET", "/v1/sandboxes", None);
    assert_eq!((s, code(&v)), (401, "unauthenticated"), "{v}");
    for bogus in ["hello", "tbk_0123456789abcdef_notthesecret"] {
        let (s, v) = Tcp {
            port: d.port,
            key: Some(bogus),
        }
        .call("GET", "/v1/sandboxes", None);
        assert_eq!((s, code(&v)), (401, "unauthenticated"), "{bogus}: {v}");
    }
    let (s, _) = http(
        d.port,
        "GET",
        "/v1/sandboxes",
        &[("X-API-Key", "nope")],
        None,
    );
    assert_eq!(s, 401);
    assert_eq!(anon.call("GET", "/healthz", None).0, 200);
    d.cli(&["ls"]).ok(); // the socket needs no key

    let (_, writer_a) = create_key(&d, "acme", &["sandboxes:read", "sandboxes:write"], &[]);
    let (_, reader_a) = create_key(&d, "acme", &["sandboxes:read"], &[]);
    let (_, deleter_a) = create_key(&d, "acme", &["sandboxes:delete"], &[]);
    let (_, all_b) = create_key(
        &d,
        "beta",
        &["sandboxes:read", "sandboxes:write", "sandboxes:delete"],
        &[],
    );
    let (_, admin) = create_key(&d, "default", &["admin"], &[]);
    keys.extend([&writer_a, &reader_a, &deleter_a, &all_b, &admin].map(|k| k.to_string()));

    // Revoked and expired keys.
    let (revoked_id, revoked) = create_key(&d, "acme", &["sandboxes:read"], &[]);
    let (_, expiring) = create_key(&d, "acme", &["sandboxes:read"], &["--expires", "1s"]);
    keys.extend([revoked.clone(), expiring.clone()]);
    assert_eq!(
        Tcp {
            port: d.port,
            key: Some(&revoked)
        }
        .call("GET", "/v1/sandboxes", None)
        .0,
        200
    );
    d.cli(&["keys", "revoke", &revoked_id]).ok();
    let (s, v) = Tcp {
        port: d.port,
        key: Some(&revoked),
    }
    .call("GET", "/v1/sandboxes", None);
    assert_eq!((s, code(&v)), (401, "unauthenticated"), "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("revoked"),
        "{v}"
    );
    wait_for("the 1s key to expire", Duration::from_secs(30), || {
        Tcp {
            port: d.port,
            key: Some(&expiring),
        }
        .call("GET", "/v1/sandboxes", None)
        .0 == 401
    });
    let ls = d.cli(&["keys", "ls", "--json"]).ok().json();
    let statuses: Vec<&str> = ls["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["status"].as_str().unwrap())
        .collect();
    assert!(
        statuses.contains(&"revoked") && statuses.contains(&"expired"),
        "{ls}"
    );
    assert!(
        !ls.to_string().contains(&admin),
        "keys ls never shows a key"
    );

    // Scopes: each allows exactly what it should.
    let w = Tcp {
        port: d.port,
        key: Some(&writer_a),
    };
    let r = Tcp {
        port: d.port,
        key: Some(&reader_a),
    };
    let del = Tcp {
        port: d.port,
        key: Some(&deleter_a),
    };
    let b = Tcp {
        port: d.port,
        key: Some(&all_b),
    };
    let adm = Tcp {
        port: d.port,
        key: Some(&admin),
    };
    let create = json!({"name": "thread-1"});
    let (s, v) = r.call("POST", "/v1/sandboxes", Some(&create));
    assert_eq!(
        (s, code(&v)),
        (403, "permission_denied"),
        "read key cannot create: {v}"
    );
    let (s, a1) = w.call("POST", "/v1/sandboxes", Some(&create));
    assert_eq!(s, 201, "{a1}");
    let a_id = a1["id"].as_str().unwrap().to_string();
    let exec = json!({"shell": "echo hi"});
    let (s, v) = w.call("POST", &format!("/v1/sandboxes/{a_id}/exec"), Some(&exec));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["stdout"], "hi\n");
    for (method, path, body) in [
        ("POST", format!("/v1/sandboxes/{a_id}/exec"), Some(&exec)),
        ("POST", format!("/v1/sandboxes/{a_id}/pause"), None),
        ("GET", format!("/v1/sandboxes/{a_id}/files?path=x"), None),
        ("DELETE", format!("/v1/sandboxes/{a_id}?force=true"), None),
        ("GET", "/v1/keys".to_string(), None),
        ("GET", "/v1/audit".to_string(), None),
        ("GET", "/metrics".to_string(), None),
    ] {
        let (s, v) = r.call(method, &path, body);
        assert_eq!(
            (s, code(&v)),
            (403, "permission_denied"),
            "read key: {method} {path}: {v}"
        );
    }
    // The read-only monitoring key sees every sandbox of its tenant and its cost.
    let (s, v) = r.call("GET", "/v1/sandboxes", None);
    assert_eq!(s, 200);
    assert_eq!(v["sandboxes"].as_array().unwrap().len(), 1, "{v}");
    let (s, v) = r.call("GET", &format!("/v1/sandboxes/{a_id}"), None);
    assert_eq!(s, 200, "{v}");
    let (s, v) = r.call("GET", "/v1/usage", None);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["tenants"][0]["tenant"], "acme");
    assert_eq!(v["tenants"][0]["sandboxes"][0]["id"], a_id.as_str());
    let (s, v) = r.call("GET", "/v1/usage?tenant=beta", None);
    assert_eq!((s, code(&v)), (403, "permission_denied"), "{v}");
    // The writer cannot delete or administer; the deleter cannot read or write.
    let (s, v) = w.call("DELETE", &format!("/v1/sandboxes/{a_id}?force=true"), None);
    assert_eq!((s, code(&v)), (403, "permission_denied"), "{v}");
    let (s, v) = w.call(
        "POST",
        "/v1/keys",
        Some(&json!({"tenant": "acme", "scopes": ["admin"]})),
    );
    assert_eq!((s, code(&v)), (403, "permission_denied"), "{v}");
    let (s, v) = w.call("PUT", "/v1/quotas/acme", Some(&json!({})));
    assert_eq!((s, code(&v)), (403, "permission_denied"), "{v}");
    let (s, v) = del.call("GET", "/v1/sandboxes", None);
    assert_eq!((s, code(&v)), (403, "permission_denied"), "{v}");
    let (s, v) = del.call("POST", "/v1/sandboxes", Some(&create));
    assert_eq!((s, code(&v)), (403, "permission_denied"), "{v}");

    // Tenants: both may have `thread-1`; each other's is not found, like a missing one.
    let (s, b1) = b.call("POST", "/v1/sandboxes", Some(&create));
    assert_eq!(s, 201, "{b1}");
    let b_id = b1["id"].as_str().unwrap().to_string();
    assert_ne!(a_id, b_id);
    let (_, v) = w.call("GET", "/v1/sandboxes/thread-1", None);
    assert_eq!(v["id"], a_id.as_str());
    let (_, v) = b.call("GET", "/v1/sandboxes/thread-1", None);
    assert_eq!(v["id"], b_id.as_str());
    let (s_missing, missing) = w.call(
        "GET",
        "/v1/sandboxes/sb-00000000000000000000000000000000",
        None,
    );
    assert_eq!(s_missing, 404);
    for (caller, other) in [(&w, &b_id), (&b, &a_id)] {
        for (method, path, body) in [
            ("GET", format!("/v1/sandboxes/{other}"), None),
            ("POST", format!("/v1/sandboxes/{other}/exec"), Some(&exec)),
            ("POST", format!("/v1/sandboxes/{other}/pause"), None),
            (
                "GET",
                format!("/v1/sandboxes/{other}/files/list?path=."),
                None,
            ),
        ] {
            let (s, v) = caller.call(method, &path, body);
            assert_eq!((s, code(&v)), (404, "not_found"), "{method} {path}: {v}");
            assert_eq!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .replace(other.as_str(), "X"),
                missing["error"]["message"]
                    .as_str()
                    .unwrap()
                    .replace("sb-00000000000000000000000000000000", "X"),
                "another tenant's sandbox reads exactly like a missing one"
            );
        }
    }
    let (s, v) = b.call("DELETE", &format!("/v1/sandboxes/{a_id}?force=true"), None);
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    let (_, v) = w.call("GET", "/v1/sandboxes", None);
    let ids: Vec<&str> = v["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        vec![a_id.as_str()],
        "a tenant lists only its own sandboxes"
    );

    // An admin acts for a tenant; the operator's socket lists tenant `default` only.
    let (s, v) = http(
        d.port,
        "GET",
        "/v1/sandboxes",
        &[
            ("Authorization", &format!("Bearer {admin}")),
            ("X-Threadbox-Tenant", "beta"),
        ],
        None,
    );
    assert_eq!(s, 200, "{v}");
    assert!(v.contains(&b_id) && !v.contains(&a_id), "{v}");
    let (s, v) = http(
        d.port,
        "GET",
        "/v1/sandboxes",
        &[
            ("Authorization", &format!("Bearer {writer_a}")),
            ("X-Threadbox-Tenant", "beta"),
        ],
        None,
    );
    assert_eq!(s, 403, "only an admin acts for another tenant: {v}");
    assert_eq!(d.cli(&["ls", "--json"]).ok().json()["sandboxes"], json!([]));
    let (s, _) = adm.call("GET", "/metrics", None);
    assert_eq!(s, 200);

    // The deleter deletes; the CLI works over TCP with THREADBOX_API_KEY.
    let (s, v) = del.call("DELETE", &format!("/v1/sandboxes/{a_id}?force=true"), None);
    assert_eq!(s, 204, "{v}");
    let out = cli_with_key(&d, &all_b, &["rm", "--force", "thread-1"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = cli_with_key(&d, &reader_a, &["create", "--name", "x"]);
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("sandboxes:write"), "{}", out.stderr);

    // Keys never reach the daemon's log; refused authentications are audited.
    let log = d.log();
    for k in &keys {
        // `tbk_<hex id>_<secret>`; the URL-safe base64 secret may itself contain '_'.
        let secret = k.splitn(3, '_').nth(2).unwrap();
        assert!(secret.len() >= 43, "short secret in {k}");
        assert!(!log.contains(secret), "a key's secret is in the daemon log");
    }
    assert!(
        log.contains("authentication refused"),
        "the refusals are logged (without keys)"
    );
    let audit = d.cli(&["audit", "ls", "--json"]).ok().json();
    let refused = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "auth.refused")
        .count();
    assert!(refused >= 4, "{audit}");
    assert!(!audit.to_string().contains(&admin));
}

#[test]
fn quotas_refuse_and_nothing_is_half_created() {
    if !require_root("quotas_refuse_and_nothing_is_half_created") {
        return;
    }
    let _serial = serial();
    let d = Daemon::start();
    let _cleanup = Cleanup {
        d: &d,
        tenants: &["acme"],
    };
    let (_, key) = create_key(
        &d,
        "acme",
        &["sandboxes:read", "sandboxes:write", "sandboxes:delete"],
        &[],
    );
    let t = Tcp {
        port: d.port,
        key: Some(&key),
    };
    d.cli(&[
        "quota",
        "set",
        "acme",
        "--max-running",
        "1",
        "--max-sandboxes",
        "2",
        "--max-memory",
        "256M",
        "--max-cpus",
        "1",
    ])
    .ok();
    let q = d.cli(&["quota", "get", "acme", "--json"]).ok().json();
    assert_eq!(q["quota"]["max_running"], 1);
    assert_eq!(q["quota"]["max_memory_bytes"], 256 << 20);

    let count = || {
        let (_, v) = t.call("GET", "/v1/sandboxes", None);
        v["sandboxes"].as_array().unwrap().len()
    };
    let dirs = || {
        std::fs::read_dir(d.root_path().join("sandboxes"))
            .unwrap()
            .count()
    };
    let refused = |body: Value, quota: &str| {
        let before = (count(), dirs());
        let (s, v) = t.call("POST", "/v1/sandboxes", Some(&body));
        assert_eq!((s, code(&v)), (429, "quota_exceeded"), "{body}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(quota) && msg.contains("limit"), "{msg}");
        assert_eq!((count(), dirs()), before, "nothing half-created");
    };
    refused(
        json!({"name": "big", "limits": {"memory_bytes": 512u64 << 20}}),
        "max_memory_bytes",
    );
    refused(
        json!({"name": "fast", "limits": {"memory_bytes": 128u64 << 20, "cpus": 2.0}}),
        "max_cpus",
    );
    let small = |name: &str| json!({"name": name, "limits": {"memory_bytes": 128u64 << 20}});
    let (s, v) = t.call("POST", "/v1/sandboxes", Some(&small("a1")));
    assert_eq!(s, 201, "{v}");
    refused(small("a2"), "max_running");
    assert_eq!(t.call("POST", "/v1/sandboxes/a1/pause", None).0, 200);
    let (s, v) = t.call("POST", "/v1/sandboxes", Some(&small("a2")));
    assert_eq!(s, 201, "paused sandboxes do not count as running: {v}");
    refused(small("a3"), "max_sandboxes");
    // Resuming a1 (explicitly or by an exec) would make two running.
    let (s, v) = t.call("POST", "/v1/sandboxes/a1/resume", None);
    assert_eq!((s, code(&v)), (429, "quota_exceeded"), "{v}");
    let (s, v) = t.call(
        "POST",
        "/v1/sandboxes/a1/exec",
        Some(&json!({"shell": "true"})),
    );
    assert_eq!((s, code(&v)), (429, "quota_exceeded"), "{v}");
    let (_, v) = t.call("GET", "/v1/sandboxes/a1", None);
    assert_eq!(v["state"], "paused", "the refused resume changed nothing");
    assert_eq!(t.call("POST", "/v1/sandboxes/a2/stop", None).0, 200);
    let (s, v) = t.call("POST", "/v1/sandboxes/a1/resume", None);
    assert_eq!(s, 200, "{v}");
    let (s, v) = t.call("POST", "/v1/sandboxes/a2/start", None);
    assert_eq!(
        (s, code(&v)),
        (429, "quota_exceeded"),
        "start counts too: {v}"
    );
    let (_, v) = t.call("GET", "/v1/sandboxes/a2", None);
    assert_eq!(v["state"], "stopped", "the refused start changed nothing");

    // Disk: once the sampled writable layers reach the quota, new work is refused.
    d.cli(&["quota", "set", "acme", "--disk-bytes", "1"]).ok();
    wait_for("a disk sample", Duration::from_secs(60), || {
        d.cli(&["quota", "get", "acme", "--json"]).ok().json()["usage"]["disk_bytes"]
            .as_u64()
            .unwrap_or(0)
            > 0
    });
    let (s, v) = t.call(
        "POST",
        "/v1/sandboxes/a1/exec",
        Some(&json!({"shell": "true"})),
    );
    assert_eq!((s, code(&v)), (429, "quota_exceeded"), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("disk_bytes"),
        "{v}"
    );
    d.cli(&["quota", "set", "acme", "--disk-bytes", "none"])
        .ok();
    let (s, v) = t.call(
        "POST",
        "/v1/sandboxes/a1/exec",
        Some(&json!({"shell": "true"})),
    );
    assert_eq!(s, 200, "{v}");

    // Bad input changes nothing.
    let before = d.cli(&["quota", "get", "acme", "--json"]).ok().json();
    d.cli(&["quota", "set", "acme", "--max-running", "lots"])
        .expect_code(1);
    assert_eq!(
        d.cli(&["quota", "get", "acme", "--json"]).ok().json()["quota"],
        before["quota"]
    );
    for id in ["a1", "a2"] {
        t.call("DELETE", &format!("/v1/sandboxes/{id}?force=true"), None);
    }
}

#[test]
fn cpu_cap_pauses_a_busy_sandbox_and_usage_is_metered() {
    if !require_root("cpu_cap_pauses_a_busy_sandbox_and_usage_is_metered") {
        return;
    }
    let _serial = serial();
    let d = Daemon::start();
    let _cleanup = Cleanup {
        d: &d,
        tenants: &["gamma"],
    };

    // Metering (operator, tenant default): CPU grows with a busy loop, stays flat paused.
    d.create(&["--name", "busy"]);
    d.cli(&["spawn", "busy", "--", "sh", "-c", "while :; do :; done"])
        .ok();
    let usage_of = |name: &str| -> Value {
        let v = d
            .cli(&["usage", "--tenant", "default", "--json"])
            .ok()
            .json();
        v["tenants"][0]["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    };
    wait_for("CPU-seconds to grow", Duration::from_secs(60), || {
        usage_of("busy")["cpu_seconds"].as_f64().unwrap_or(0.0) > 1.0
    });
    let first = usage_of("busy")["cpu_seconds"].as_f64().unwrap();
    wait_for(
        "CPU-seconds to keep growing",
        Duration::from_secs(60),
        || usage_of("busy")["cpu_seconds"].as_f64().unwrap() > first + 0.5,
    );
    d.cli(&["pause", "busy"]).ok();
    let paused = usage_of("busy");
    let cpu_paused = paused["cpu_seconds"].as_f64().unwrap();
    let paused_s = paused["paused_seconds"].as_f64().unwrap();
    wait_for("paused time to accrue", Duration::from_secs(60), || {
        usage_of("busy")["paused_seconds"].as_f64().unwrap() >= paused_s + 2.0
    });
    let later = usage_of("busy");
    assert!(
        (later["cpu_seconds"].as_f64().unwrap() - cpu_paused).abs() < 0.05,
        "CPU stays flat while paused: {paused} then {later}"
    );
    assert!(later["running_seconds"].as_f64().unwrap() > 0.0, "{later}");
    assert!(
        later["memory_gib_seconds"].as_f64().unwrap() > 0.0,
        "{later}"
    );
    assert!(later["peak_memory_bytes"].as_u64().unwrap() > 0, "{later}");
    let tenant = d
        .cli(&["usage", "--tenant", "default", "--json"])
        .ok()
        .json();
    assert!(tenant["tenants"][0]["cpu_seconds"].as_f64().unwrap() >= cpu_paused - 0.01);
    d.cli(&["rm", "--force", "busy"]).ok();

    // The daily CPU cap pauses the tenant's busy sandbox and refuses more work.
    let (_, key) = create_key(
        &d,
        "gamma",
        &["sandboxes:read", "sandboxes:write", "sandboxes:delete"],
        &[],
    );
    d.cli(&["quota", "set", "gamma", "--cpu-seconds-per-day", "2"])
        .ok();
    let out = cli_with_key(&d, &key, &["create", "--name", "spin"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = cli_with_key(
        &d,
        &key,
        &["spawn", "spin", "--", "sh", "-c", "while :; do :; done"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    wait_for(
        "the CPU cap to pause the sandbox",
        Duration::from_secs(90),
        || cli_with_key(&d, &key, &["info", "spin", "--json"]).json()["state"] == "paused",
    );
    let out = cli_with_key(&d, &key, &["exec", "spin", "--", "true"]);
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("cpu_seconds_per_day"), "{}", out.stderr);
    let out = cli_with_key(&d, &key, &["resume", "spin"]);
    assert!(out.stderr.contains("cpu_seconds_per_day"), "{}", out.stderr);
    let out = cli_with_key(&d, &key, &["usage", "--json"]);
    let today = out.json()["tenants"][0]["cpu_seconds_today"]
        .as_f64()
        .unwrap();
    assert!(today >= 2.0, "{today}");
    let audit = d.cli(&["audit", "ls", "--json"]).ok().json();
    assert!(
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "sandbox.pause"
                && e["tenant"] == "gamma"
                && e["key_id"] == "daemon"),
        "the cap's pause is audited as the daemon's: {audit}"
    );
    let out = cli_with_key(&d, &key, &["rm", "--force", "spin"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
}

#[test]
fn audit_chain_verifies_and_names_the_first_tampered_entry() {
    if !require_root("audit_chain_verifies_and_names_the_first_tampered_entry") {
        return;
    }
    let _serial = serial();
    let d = Daemon::start();
    let id = d.create(&["--name", "audited"]);
    d.cli(&["pause", "audited"]).ok();
    d.cli(&["resume", "audited"]).ok();
    d.cli(&["exec", "audited", "--", "true"]).ok();
    d.cli(&["quota", "set", "acme", "--max-running", "3"]).ok();
    d.cli(&["rm", "--force", "audited"]).ok();
    let (s, _) = Tcp {
        port: d.port,
        key: None,
    }
    .call("POST", "/v1/sandboxes", Some(&json!({})));
    assert_eq!(s, 401);

    let export = d.cli(&["audit", "export"]).ok().stdout_str();
    let entries: Vec<Value> = export
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSONL"))
        .collect();
    assert!(entries.len() >= 7, "{export}");
    let actions: Vec<&str> = entries
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    for a in [
        "sandbox.create",
        "sandbox.pause",
        "sandbox.resume",
        "sandbox.exec",
        "quota.set",
        "sandbox.delete",
        "auth.refused",
    ] {
        assert!(actions.contains(&a), "{a} missing from {actions:?}");
    }
    let created = entries
        .iter()
        .find(|e| e["action"] == "sandbox.create")
        .unwrap();
    assert_eq!(created["target"], id.as_str());
    assert_eq!(created["result"], "ok");
    assert_eq!(entries[0]["seq"], 1);
    assert_eq!(entries[1]["prev_hash"], entries[0]["hash"]);
    let v = d.cli(&["audit", "verify", "--json"]).ok().json();
    assert_eq!(v["ok"], true, "{v}");
    d.cli(&["audit", "verify"]).ok();

    let db = d.root_path().join("state.db");
    let broken_at = |expected: u64| {
        let run = d.cli(&["audit", "verify"]).expect_code(1);
        assert!(
            run.stderr.contains(&format!("entry {expected}")),
            "{}",
            run.stderr
        );
        let v = d.cli(&["audit", "verify", "--json"]).expect_code(1).json();
        assert_eq!(v["first_bad_seq"], expected, "{v}");
    };
    // Edit entry 3, then put it back.
    let original: String = entries[2]["result"].as_str().unwrap().to_string();
    sql(
        &db,
        &["UPDATE audit_log SET result = 'forged' WHERE seq = 3"],
    );
    broken_at(3);
    sql(
        &db,
        &[&format!(
            "UPDATE audit_log SET result = '{original}' WHERE seq = 3"
        )],
    );
    d.cli(&["audit", "verify"]).ok();
    // Swap entries 2 and 4, then swap them back.
    let swap = [
        "UPDATE audit_log SET seq = -2 WHERE seq = 2",
        "UPDATE audit_log SET seq = 2 WHERE seq = 4",
        "UPDATE audit_log SET seq = 4 WHERE seq = -2",
    ];
    sql(&db, &swap);
    broken_at(2);
    sql(&db, &swap);
    d.cli(&["audit", "verify"]).ok();
    // Delete entry 5.
    sql(&db, &["DELETE FROM audit_log WHERE seq = 5"]);
    broken_at(5);
}
