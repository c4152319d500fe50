//! Packages just work (issue 13 scope 6, ADR 0067): in the default (host) image, `pip
//! install` and `npm install` from an allowed index need no flag, land on the sandbox's
//! persistent disk and are still there next call, after stop/start and after a daemon
//! restart. The index is the test upstream's (`tests/network/upstream.py`: PEP 503 pages,
//! a wheel and an npm registry for a tiny `tbdemo` package), in a netns of the test's own.

mod common;

use common::upstream::{daemon, Upstream};
use common::{require_root, serial, Daemon};

fn sh(d: &Daemon, sb: &str, script: &str) -> (i32, String) {
    let r = d.cli(&["exec", sb, "--", "bash", "-c", script]);
    (r.code, format!("{}{}", r.stdout_str(), r.stderr))
}

/// No `--break-system-packages`, no `--user`: only where the index is.
const PIP: &str = "pip install --no-cache-dir --index-url http://pypi.test:8080/simple/ \
                   --trusted-host pypi.test tbdemo";
const NPM_REGISTRY: &str = "--registry http://npm.test:8080/npm/ --no-audit --no-fund";

/// What proves both installs are there: an import, a local module, a global bin.
const CHECK: &str = "python3 -c 'import tbdemo; print(tbdemo.VALUE)' && \
     cd ~/proj && node -e \"console.log(require('tbdemo'))\" && tbdemo";

fn check(d: &Daemon, sb: &str, when: &str) {
    let (code, out) = sh(d, sb, CHECK);
    assert_eq!(code, 0, "{when}: {out}");
    assert_eq!(
        out.matches("tbdemo works").count(),
        3,
        "{when}: the packages are gone: {out}"
    );
}

#[test]
fn pip_and_npm_install_persist_without_flags() {
    if !require_root("pip_and_npm_install_persist_without_flags") {
        return;
    }
    let _s = serial();
    let up = Upstream::start();
    let mut d = daemon(&up, true);
    let sb = d.create(&["--allow", "pypi.test:8080", "--allow", "npm.test:8080"]);

    // Control: before the install, the import fails (so the check below can fail).
    let (code, _) = sh(&d, &sb, "python3 -c 'import tbdemo'");
    assert_ne!(code, 0, "tbdemo importable before any install");

    let (code, out) = sh(&d, &sb, PIP);
    assert_eq!(code, 0, "pip install failed: {out}");
    assert!(
        !out.contains("externally-managed"),
        "PEP 668 refused: {out}"
    );
    let (code, out) = sh(
        &d,
        &sb,
        &format!(
            "mkdir -p ~/proj && cd ~/proj && npm install {NPM_REGISTRY} tbdemo && \
             npm install -g {NPM_REGISTRY} tbdemo"
        ),
    );
    assert_eq!(code, 0, "npm install failed: {out}");
    // The bytes came from the allowed index, by name.
    let http = up.log("http.log");
    assert!(http.contains("/simple/tbdemo/"), "{http}");
    assert!(http.contains("/npm/tbdemo/-/tbdemo-1.0.0.tgz"), "{http}");

    // On the sandbox's own disk (the user's home), not somewhere that vanishes.
    let (code, out) = sh(
        &d,
        &sb,
        "python3 -c 'import tbdemo; print(tbdemo.__file__)'; command -v tbdemo",
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("/home/user/.local/lib/python3"), "{out}");
    assert!(out.contains("/home/user/.local/bin/tbdemo"), "{out}");
    check(&d, &sb, "the next call");

    d.cli(&["stop", &sb]).ok();
    d.cli(&["start", &sb]).ok();
    check(&d, &sb, "after stop/start");

    d.terminate();
    d.restart();
    // A clean shutdown may have stopped it; the disk is what must survive.
    let info = d.cli(&["info", "--json", &sb]).ok().json();
    if info["state"] == "stopped" {
        d.cli(&["start", &sb]).ok();
    }
    check(&d, &sb, "after a daemon restart");

    // A host the policy does not name is no index: nothing reaches the upstream.
    let (code, out) = sh(
        &d,
        &sb,
        "pip download --no-cache-dir -d /tmp/dl --index-url http://other.test:8080/simple/ \
         --trusted-host other.test --retries 0 --timeout 5 tbdemo",
    );
    assert_ne!(code, 0, "an index off the policy worked: {out}");
    assert!(
        !up.log("dns.log").contains("other.test"),
        "{}",
        up.log("dns.log")
    );
}
