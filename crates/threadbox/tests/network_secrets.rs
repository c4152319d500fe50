//! Secrets the sandbox never holds (issue 13 scope 4, ADR 0068), end to end with a real
//! daemon, a real sandbox and the shared test upstream (`common/upstream.rs`: its HTTPS
//! server on 443 is signed by a test CA the daemon trusts with `--egress-upstream-ca`).
//! Verdicts are the bytes the upstream received (`https.log`: path and headers of each
//! request) and byte searches of everything the sandbox and the daemon hold.

mod common;

use common::upstream::{daemon_with, Upstream, DEADLINE};
use common::{require_root, serial, wait_for, Daemon};
use std::path::Path;

const VALUE: &str = "sk-REAL-9f3c1a7e55d04b2a";

fn sh(d: &Daemon, sb: &str, script: &str) -> (i32, String) {
    let r = d.cli(&["exec", sb, "--", "bash", "-c", script]);
    (r.code, format!("{}{}", r.stdout_str(), r.stderr))
}

/// The upstream's log entry of the request for `path` (its header lines), if any.
fn request(up: &Upstream, path: &str) -> Option<String> {
    let log = up.log("https.log");
    log.split("\n\n")
        .find(|r| r.lines().next() == Some(path))
        .map(str::to_string)
}

/// Every file under `dir` (up to 256 MiB each) holding `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            let p = e.path();
            if ft.is_dir() {
                // Mount points of the running sandbox are read from inside instead.
                if !p.ends_with("proc") && !p.ends_with("sys") && !p.ends_with("dev") {
                    stack.push(p);
                }
            } else if ft.is_file() {
                let small = e.metadata().is_ok_and(|m| m.len() <= 256 << 20);
                if small {
                    if let Ok(b) = std::fs::read(&p) {
                        if b.windows(needle.len()).any(|w| w == needle) {
                            hits.push(p.display().to_string());
                        }
                    }
                }
            }
        }
    }
    hits
}

/// The host pid of the process whose command line holds `arg` (the sandbox's pid
/// namespace hides it from inside; the host sees every process).
fn host_pid_of(arg: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        cmd.split(|b| *b == 0)
            .any(|a| a == arg.as_bytes())
            .then_some(pid)
    })
}

/// How many readable mappings of `pid` hold `a`, and how many hold `b`.
fn memory_hits(pid: u32, a: &[u8], b: &[u8]) -> (usize, usize) {
    use std::io::{Read, Seek, SeekFrom};
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("open mem");
    let (mut ha, mut hb) = (0, 0);
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        if !perms.starts_with('r') || line.contains("[vvar") {
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
        if mem.read_exact(&mut buf).is_err() {
            continue;
        }
        ha += usize::from(buf.windows(a.len()).any(|w| w == a));
        hb += usize::from(buf.windows(b.len()).any(|w| w == b));
    }
    (ha, hb)
}

#[test]
fn secrets_are_swapped_on_their_host_only_and_never_reach_the_sandbox() {
    if !require_root("secrets_are_swapped_on_their_host_only_and_never_reach_the_sandbox") {
        return;
    }
    let _s = serial();
    let up = Upstream::start();
    let ca = up.ca_file();
    let d = daemon_with(
        &up,
        true,
        &["--egress-upstream-ca", ca.to_str().expect("utf-8 path")],
    );

    // The value goes in on stdin; argv never holds it.
    let set = d.cli_stdin(
        &[
            "secret",
            "set",
            "API_KEY",
            "--host",
            "api.test",
            "--format",
            "Bearer {}",
        ],
        Some(format!("{VALUE}\n").as_bytes()),
    );
    let set = set.ok();
    assert!(!set.stdout_str().contains(VALUE));
    // Bad input changes nothing.
    let bad = d.cli_stdin(&["secret", "set", "BAD", "--host", "*.test"], Some(b"v\n"));
    assert_ne!(bad.code, 0, "a wildcard host was taken");
    let ls = d.cli(&["secret", "ls", "--json"]).ok();
    let list = ls.json();
    assert_eq!(list["secrets"].as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list["secrets"][0]["name"], "API_KEY");
    assert_eq!(list["secrets"][0]["host"], "api.test");
    assert!(!ls.stdout_str().contains(VALUE));
    // A create naming a secret that does not exist is refused before anything exists.
    let refused = d.cli(&["create", "--secret", "NOPE", "--allow", "api.test"]);
    assert_ne!(refused.code, 0, "a create with an unknown secret was taken");

    let sb = d.create(&[
        "--allow",
        "api.test",
        "--allow",
        "other.test",
        "--secret",
        "API_KEY",
        "--disk",
        "64M",
    ]);

    // The sandbox holds a placeholder, and trusts the daemon's CA through its bundle.
    let (code, ph) = sh(&d, &sb, "printf %s \"$API_KEY\"");
    assert_eq!(code, 0, "{ph}");
    assert!(ph.starts_with("tb_secret_"), "placeholder: {ph}");
    assert!(!ph.contains(VALUE));
    let (_, env) = sh(&d, &sb, "env");
    for var in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "PIP_CERT",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_CAINFO",
    ] {
        assert!(env.contains(&format!("{var}=")), "{var} missing: {env}");
    }

    // 1. Bearer: curl verifies the daemon's leaf (no -k) and the upstream gets the value.
    let (code, out) = sh(
        &d,
        &sb,
        "curl -sS --max-time 20 -H \"Authorization: $API_KEY\" https://api.test/bearer",
    );
    assert_eq!(code, 0, "curl failed: {out}");
    assert_eq!(out, "hello over tls\n");
    let r = request(&up, "/bearer").expect("the upstream got /bearer");
    assert!(r.contains(&format!("Authorization: Bearer {VALUE}")), "{r}");

    // 2. Basic auth: the placeholder inside the base64 is swapped.
    let (code, out) = sh(
        &d,
        &sb,
        "curl -sS --max-time 20 -u \"user:$API_KEY\" https://api.test/basic",
    );
    assert_eq!(code, 0, "curl failed: {out}");
    let r = request(&up, "/basic").expect("the upstream got /basic");
    let basic = std::process::Command::new("base64")
        .arg("-w0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .expect("stdin")
                .write_all(format!("user:{VALUE}").as_bytes())?;
            c.wait_with_output()
        })
        .expect("base64");
    let basic = String::from_utf8_lossy(&basic.stdout).into_owned();
    assert!(r.contains(&format!("Authorization: Basic {basic}")), "{r}");

    // 3. The placeholder sent to a host no secret names goes out unchanged (spliced TLS:
    //    the sandbox does not trust the test CA, hence -k).
    let (code, out) = sh(
        &d,
        &sb,
        "curl -sSk --max-time 20 -H \"Authorization: $API_KEY\" https://other.test/other",
    );
    assert_eq!(code, 0, "curl failed: {out}");
    let r = request(&up, "/other").expect("the upstream got /other");
    assert!(r.contains(&format!("Authorization: {ph}")), "{r}");
    assert!(!r.contains(VALUE), "swapped for another host: {r}");

    // 4. A Host switched inside an intercepted session: the first request (positive
    //    control) is swapped, the second is never sent. The process then waits, and the
    //    test reads its whole memory from the host (a core of the process that used it).
    let script = r#"
import http.client, os, ssl, time
ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
c = http.client.HTTPSConnection("api.test", context=ctx, timeout=20)
c.request("GET", "/ka-1", headers={"Authorization": os.environ["API_KEY"]})
out = ["first " + c.getresponse().read().decode().strip()]
try:
    c.request("GET", "/ka-2", headers={"Host": "other.test", "Authorization": os.environ["API_KEY"]})
    out.append("second %d" % c.getresponse().status)
except Exception as e:
    out.append("second refused " + type(e).__name__)
open("/tmp/ka.out", "w").write("\n".join(out) + "\n")
deadline = time.monotonic() + 120
while not os.path.exists("/tmp/ka.exit") and time.monotonic() < deadline:
    time.sleep(0.05)
"#;
    d.cli_stdin(
        &["files", "write", &sb, "/tmp/tb-ka.py"],
        Some(script.as_bytes()),
    )
    .ok();
    d.cli(&["spawn", &sb, "--", "python3", "/tmp/tb-ka.py"])
        .ok();
    wait_for("the keep-alive script", DEADLINE, || {
        sh(&d, &sb, "test -s /tmp/ka.out").0 == 0
    });
    let (_, out) = sh(&d, &sb, "cat /tmp/ka.out");
    assert!(out.contains("first hello over tls"), "{out}");
    assert!(!out.contains("second 200"), "{out}");
    let r = request(&up, "/ka-1").expect("the upstream got /ka-1");
    assert!(r.contains(&format!("Bearer {VALUE}")), "{r}");
    assert!(
        request(&up, "/ka-2").is_none(),
        "the switched request was sent"
    );
    let pid = host_pid_of("/tmp/tb-ka.py").expect("the script's host pid");
    let (ph_hits, value_hits) = memory_hits(pid, ph.as_bytes(), VALUE.as_bytes());
    assert!(
        ph_hits > 0,
        "positive control: the memory read finds the placeholder"
    );
    assert_eq!(
        value_hits, 0,
        "the value is in the memory of a sandbox process"
    );
    sh(&d, &sb, "touch /tmp/ka.exit");

    // 5. Nowhere: the sandbox's environment and processes, its disk, the daemon's root
    //    (state.db, keys, logs, the sandbox's disk image) and every API answer.
    let (_, environ) = sh(&d, &sb, "cat /proc/[0-9]*/environ | tr '\\0' '\\n'");
    assert!(
        environ.contains(&ph),
        "positive control: the placeholder is in some environ"
    );
    assert!(
        !environ.contains(VALUE),
        "the value is in a process environment"
    );
    // The pattern matches the value without being it (the exec's own argv may be logged).
    let pattern = format!("{}[{}]{}", &VALUE[..10], &VALUE[10..11], &VALUE[11..]);
    let (code, out) = sh(
        &d,
        &sb,
        &format!(
            "echo \"$API_KEY\" > ~/placeholder.txt; sync; \
             grep -rlsE '{pattern}' /etc /root /tmp /home /var /opt 2>/dev/null; echo end"
        ),
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "end\n", "the value is on the sandbox's disk: {out}");
    let root = d.root_path();
    assert!(
        !files_holding(root, ph.as_bytes()).is_empty(),
        "positive control: the host-side scan finds the placeholder the sandbox wrote"
    );
    let leaks: Vec<String> = files_holding(root, VALUE.as_bytes()).into_iter().collect();
    assert!(
        leaks.is_empty(),
        "the value is in the daemon's files: {leaks:?}"
    );
    assert!(!d.log().contains(VALUE), "the value is in the daemon's log");
    assert!(d.log().contains("secret swapped"), "swaps are logged");
    for answer in [
        d.cli(&["info", "--json", &sb]).ok().stdout_str(),
        d.cli(&["secret", "ls"]).ok().stdout_str(),
        d.cli(&["ls", "--json"]).ok().stdout_str(),
    ] {
        assert!(
            !answer.contains(VALUE),
            "an API answer holds the value: {answer}"
        );
    }

    // 5b. A live policy change closes an intercepted session it refuses. The script keeps
    //     one session open between two requests; first with no change (the positive
    //     control: the second request arrives on the same session), then with api.test
    //     removed from the policy in between (the second never arrives).
    let script = r#"
import http.client, os, ssl, sys, time
tag = sys.argv[1]
ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
c = http.client.HTTPSConnection("api.test", context=ctx, timeout=20)
c.request("GET", "/" + tag + "-1", headers={"Authorization": os.environ["API_KEY"]})
c.getresponse().read()
open("/tmp/" + tag + ".ready", "w").close()
deadline = time.monotonic() + 60
while not os.path.exists("/tmp/" + tag + ".go") and time.monotonic() < deadline:
    time.sleep(0.05)
try:
    c.request("GET", "/" + tag + "-2", headers={"Authorization": os.environ["API_KEY"]})
    c.getresponse().read()
    r = "sent"
except Exception as e:
    r = "closed " + type(e).__name__
open("/tmp/" + tag + ".out", "w").write(r + "\n")
"#;
    d.cli_stdin(
        &["files", "write", &sb, "/tmp/tb-rev.py"],
        Some(script.as_bytes()),
    )
    .ok();
    for (tag, revoke) in [("ctl", false), ("rev", true)] {
        d.cli(&["spawn", &sb, "--", "python3", "/tmp/tb-rev.py", tag])
            .ok();
        wait_for("the first request of the session", DEADLINE, || {
            sh(&d, &sb, &format!("test -e /tmp/{tag}.ready")).0 == 0
        });
        if revoke {
            d.cli(&["net", "set", &sb, "--allow", "other.test"]).ok();
        }
        sh(&d, &sb, &format!("touch /tmp/{tag}.go"));
        wait_for("the second request's outcome", DEADLINE, || {
            sh(&d, &sb, &format!("test -s /tmp/{tag}.out")).0 == 0
        });
        let first = request(&up, &format!("/{tag}-1"));
        assert!(
            first.is_some_and(|r| r.contains(VALUE)),
            "{tag}: first request not swapped"
        );
        let second = request(&up, &format!("/{tag}-2"));
        if revoke {
            assert!(
                second.is_none(),
                "a revoked intercepted session still carried a request"
            );
        } else {
            assert!(
                second.is_some(),
                "positive control: the session carries a second request"
            );
        }
    }
    d.cli(&[
        "net",
        "set",
        &sb,
        "--allow",
        "api.test",
        "--allow",
        "other.test",
    ])
    .ok();

    // 6. Removed: the placeholder then goes out unchanged even to its host.
    d.cli(&["secret", "rm", "API_KEY"]).ok();
    let (_, out) = sh(
        &d,
        &sb,
        "curl -sSk --max-time 20 -H \"Authorization: $API_KEY\" https://api.test/after-rm",
    );
    wait_for("the request after rm", DEADLINE, || {
        request(&up, "/after-rm").is_some()
    });
    let r = request(&up, "/after-rm").unwrap_or_default();
    assert!(!r.contains(VALUE), "swapped after rm: {r} {out}");
    d.cli(&["rm", "-f", &sb]);
}
