//! The rest of issue 13's "How it is tested here", end to end with a real daemon and the
//! netns upstream of `common/upstream.rs`: `git clone` over dumb HTTP through a policy
//! (and refused without it), a fork keeping its parent's policy, and the daemon's CA
//! trusted through the image's own bundle by programs that read only their defaults.

mod common;

use common::upstream::{daemon, daemon_with, Upstream, DEADLINE};
use common::{require_root, serial, wait_for, Daemon};
use std::path::Path;
use std::process::Command;

fn sh(d: &Daemon, sb: &str, script: &str) -> (i32, String) {
    let r = d.cli(&["exec", sb, "--", "bash", "-c", script]);
    (r.code, format!("{}{}", r.stdout_str(), r.stderr))
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t.test"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A bare repository served over dumb HTTP by the upstream (`/git/repo.git`), one commit
/// holding `README` = `marker`.
fn serve_repo(up: &Upstream, marker: &str) {
    let work = up.dir.path().join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    git(&work, &["init", "-q", "-b", "main"]);
    std::fs::write(work.join("README"), marker).expect("README");
    git(&work, &["add", "README"]);
    git(&work, &["commit", "-q", "-m", "one"]);
    let bare = up.dir.path().join("git/repo.git");
    std::fs::create_dir_all(bare.parent().expect("parent")).expect("git dir");
    git(
        up.dir.path(),
        &["clone", "-q", "--bare", "work", "git/repo.git"],
    );
    // What a dumb-HTTP client reads: info/refs and objects/info/packs.
    git(&bare, &["update-server-info"]);
}

#[test]
fn git_clones_over_dumb_http_only_through_an_allowed_policy() {
    if !require_root("git_clones_over_dumb_http_only_through_an_allowed_policy") {
        return;
    }
    let _s = serial();
    let up = Upstream::start();
    let marker = format!("marker-{}", std::process::id());
    serve_repo(&up, &marker);
    let d = daemon(&up, true);

    let allowed = d.create(&["--allow", "api.test:8080"]);
    let (code, out) = sh(
        &d,
        &allowed,
        "git clone -q http://api.test:8080/git/repo.git /tmp/r && cat /tmp/r/README",
    );
    assert_eq!(code, 0, "git clone through the policy failed: {out}");
    assert!(out.contains(&marker), "{out}");
    assert!(
        up.log("http.log").contains("/git/repo.git/info/refs"),
        "the clone did not come from the upstream: {}",
        up.log("http.log")
    );

    // Without the name in the policy: by name (NXDOMAIN) and by the upstream's IP (no
    // name to check), nothing reaches the upstream.
    let denied = d.create(&["--allow", "other.test"]);
    let (code, out) = sh(
        &d,
        &denied,
        &format!(
            "git clone -q http://api.test:8080/git/denied-name.git /tmp/a; \
             git clone -q http://{}:8080/git/denied-ip.git /tmp/b; \
             test -e /tmp/a || test -e /tmp/b",
            up.addr()
        ),
    );
    assert_ne!(code, 0, "a clone worked without the policy: {out}");
    // The fence: a request of the allowed sandbox sent after the refused ones arrives.
    let (code, out) = sh(
        &d,
        &allowed,
        "curl -sS --max-time 20 http://api.test:8080/fence-git",
    );
    assert_eq!(code, 0, "{out}");
    wait_for("the fence", DEADLINE, || {
        up.log("http.log").contains("/fence-git")
    });
    let log = up.log("http.log");
    assert!(
        !log.contains("denied-"),
        "a refused clone reached it: {log}"
    );
}

#[test]
fn a_fork_keeps_its_parents_policy() {
    if !require_root("a_fork_keeps_its_parents_policy") {
        return;
    }
    let _s = serial();
    let up = Upstream::start();
    let d = daemon(&up, true);
    d.create(&["--name", "parent", "--allow", "api.test:8080"]);
    let parent = d.cli(&["info", "--json", "parent"]).ok().json();
    let out = d
        .cli(&["fork", "parent", "--name-prefix", "kid", "--json"])
        .ok()
        .json();
    let kid = out["sandboxes"][0]["name"]
        .as_str()
        .expect("a fork")
        .to_string();
    let info = d.cli(&["info", "--json", &kid]).ok().json();
    assert_eq!(info["network"], parent["network"], "{info}");
    assert!(
        info["network"].is_object(),
        "the parent has a policy: {parent}"
    );
    // And it is enforced: the allowed name answers, another is refused.
    let (code, out) = sh(
        &d,
        &kid,
        "curl -sS --max-time 20 http://api.test:8080/from-the-fork",
    );
    assert_eq!(code, 0, "{out}");
    wait_for("the fork's request", DEADLINE, || {
        up.log("http.log").contains("/from-the-fork")
    });
    let (code, _) = sh(
        &d,
        &kid,
        "curl -sS --max-time 10 http://other.test:8080/not-allowed",
    );
    assert_ne!(code, 0, "a name the parent's policy does not allow worked");
}

/// A sandbox with a secret trusts the daemon's CA through the image's own bundle path
/// (`/etc/ssl/certs/ca-certificates.crt`), not only the env variables: curl without
/// `--cacert` and Python's `ssl.create_default_context()` with every CA variable unset
/// verify the intercepted host. Control: a sandbox without secrets (the same commands)
/// does not trust the daemon's CA — the upstream's test CA is trusted by neither.
#[test]
fn the_egress_ca_is_trusted_through_the_images_bundle() {
    if !require_root("the_egress_ca_is_trusted_through_the_images_bundle") {
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
    d.cli_stdin(
        &["secret", "set", "API_KEY", "--host", "api.test"],
        Some(b"sk-bundle-value\n"),
    )
    .ok();
    let with = d.create(&["--allow", "api.test", "--secret", "API_KEY"]);
    let without = d.create(&["--allow", "api.test"]);
    let unset = "unset SSL_CERT_FILE SSL_CERT_DIR REQUESTS_CA_BUNDLE PIP_CERT GIT_SSL_CAINFO \
                 CURL_CA_BUNDLE NODE_EXTRA_CA_CERTS";
    let probe = format!(
        "{unset}; curl -sS --max-time 20 https://api.test/bundle-curl-$1 && \
         python3 -c \"import ssl, urllib.request as u; \
         print(u.urlopen('https://api.test/bundle-py-$1', \
         context=ssl.create_default_context(), timeout=20).read().decode().strip())\""
    );
    let (code, out) = sh(&d, &with, &format!("set -- with; {probe}"));
    assert_eq!(
        code, 0,
        "the image's bundle does not trust the daemon's CA: {out}"
    );
    assert!(out.contains("hello over tls"), "{out}");
    for p in ["/bundle-curl-with", "/bundle-py-with"] {
        assert!(up.log("https.log").contains(p), "{p} did not arrive");
    }
    let (code, out) = sh(&d, &without, &format!("set -- without; {probe}"));
    assert_ne!(
        code, 0,
        "control: without a secret the bundle is the image's: {out}"
    );
    // The image's own roots are still in it (the bundle is the image's plus the CA).
    let (_, n_with) = sh(
        &d,
        &with,
        "grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt",
    );
    let (_, n_without) = sh(
        &d,
        &without,
        "grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt",
    );
    let (a, b): (usize, usize) = (
        n_with.trim().parse().unwrap_or(0),
        n_without.trim().parse().unwrap_or(0),
    );
    assert_eq!(a, b + 1, "with {n_with} vs without {n_without}");
}

/// The host pid of the process whose command line holds `arg`.
fn host_pid_of(arg: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        cmd.split(|b| *b == 0)
            .any(|a| a == arg.as_bytes())
            .then_some(pid)
    })
}

/// Egress fails closed while the daemon is down (nothing a sandbox sends then reaches the
/// upstream, not even later) and the policy is back after a restart. A process inside
/// sends numbered requests in a loop and counts them in a file the host reads through
/// `/proc/PID/root`; requests completed while the daemon was down must never arrive.
#[test]
fn egress_fails_closed_while_the_daemon_is_down_and_the_policy_survives_a_restart() {
    if !require_root(
        "egress_fails_closed_while_the_daemon_is_down_and_the_policy_survives_a_restart",
    ) {
        return;
    }
    let _s = serial();
    let up = Upstream::start();
    let mut d = daemon(&up, true);
    let sb = d.create(&["--allow", "api.test"]);
    let tag = format!("down{}", std::process::id());
    let script = format!(
        r#"import socket, time
i = 0
while i < 100000:
    i += 1
    try:
        s = socket.create_connection(("{ip}", 80), timeout=2)
        s.sendall(b"GET /{tag}-%d HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n" % i)
        s.recv(100)
        s.close()
    except OSError:
        pass
    with open("/tmp/attempts.tmp", "w") as f:
        f.write(str(i))
    import os; os.rename("/tmp/attempts.tmp", "/tmp/attempts")
    time.sleep(0.05)
"#,
        ip = up.addr()
    );
    let path = format!("/tmp/tb-{tag}.py");
    d.cli_stdin(&["files", "write", &sb, &path], Some(script.as_bytes()))
        .ok();
    d.cli(&["spawn", &sb, "--", "python3", &path]).ok();
    wait_for("a request through the daemon", DEADLINE, || {
        up.log("http.log").contains(&format!("/{tag}-"))
    });
    let pid = host_pid_of(&path).expect("the loop's host pid");
    let attempts = || -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/root/tmp/attempts"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    d.kill9();
    let k0 = attempts();
    wait_for("attempts while the daemon is down", DEADLINE, || {
        attempts() >= k0 + 8
    });
    let k1 = attempts();
    d.restart();
    // After the restart the policy is back: a request numbered after k1 arrives.
    let after = |log: &str| {
        log.lines()
            .filter_map(|l| l.strip_prefix(&format!("/{tag}-")))
            .filter_map(|n| n.parse::<u64>().ok())
            .any(|n| n > k1)
    };
    wait_for("a request after the restart", DEADLINE, || {
        after(&up.log("http.log"))
    });
    // One or two attempts may have been in flight when the daemon died.
    let log = up.log("http.log");
    let leaked: Vec<u64> = log
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("/{tag}-")))
        .filter_map(|n| n.parse::<u64>().ok())
        .filter(|n| *n > k0 + 2 && *n <= k1)
        .collect();
    assert!(
        leaked.is_empty(),
        "requests sent while the daemon was down reached the upstream: {leaked:?} (down from {k0} to {k1})"
    );
    let info = d.cli(&["info", "--json", &sb]).ok().json();
    assert!(info["network"].is_object(), "{info}");
}

/// Presets by name (`--allow python-packages --allow npm --allow github`) open their
/// hosts, and programs that ignore proxy variables reach them transparently: pip, Node's
/// `fetch`, curl, a raw Python socket. The stub resolver answers every name with the
/// upstream, whose port 80 serves the package index; a name no preset holds is refused.
#[test]
fn presets_open_their_hosts_to_programs_that_ignore_proxies() {
    if !require_root("presets_open_their_hosts_to_programs_that_ignore_proxies") {
        return;
    }
    let _s = serial();
    let up = Upstream::start();
    let d = daemon(&up, true);
    let sb = d.create(&[
        "--allow",
        "python-packages",
        "--allow",
        "npm",
        "--allow",
        "github",
    ]);
    let info = d.cli(&["info", "--json", &sb]).ok().json();
    assert!(
        info["network"].to_string().contains("python-packages"),
        "{info}"
    );
    let script = "unset HTTP_PROXY HTTPS_PROXY http_proxy https_proxy; set -e; \
        pip download -q --no-deps -d /tmp/dl --index-url http://pypi.org/simple/ \
          --trusted-host pypi.org tbdemo; ls /tmp/dl; \
        node -e \"fetch('http://registry.npmjs.org/npm/tbdemo').then(r => r.json()).then(j => console.log('node', j.name))\"; \
        curl -sS --max-time 20 http://github.com/via-curl; \
        python3 -c \"import socket; s = socket.create_connection(('api.github.com', 80), timeout=10); \
          s.sendall(b'GET /via-socket HTTP/1.1\\r\\nHost: api.github.com\\r\\nConnection: close\\r\\n\\r\\n'); \
          print(s.recv(12).decode())\"";
    let (code, out) = sh(&d, &sb, script);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("tbdemo-1.0-py3-none-any.whl"), "pip: {out}");
    assert!(out.contains("node tbdemo"), "node fetch: {out}");
    assert!(out.contains("hello from the upstream"), "curl: {out}");
    assert!(out.contains("HTTP/1."), "socket: {out}");
    let log = up.log("http.log");
    for p in ["/simple/tbdemo/", "/npm/tbdemo", "/via-curl", "/via-socket"] {
        assert!(log.contains(p), "{p} did not reach the upstream: {log}");
    }
    let (code, out) = sh(
        &d,
        &sb,
        "curl -sS --max-time 10 http://example.org/not-in-a-preset",
    );
    assert_ne!(code, 0, "a name no preset holds was reached: {out}");
    let dns = up.log("dns.log");
    assert!(
        !dns.contains("example.org"),
        "a denied name was forwarded: {dns}"
    );
}
