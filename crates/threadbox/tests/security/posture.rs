//! The posture the daemon itself guarantees, judged from the host: sandboxes refuse to
//! start without a documented layer unless the operator chose so, and two daemons on one
//! host never share host uids.

use crate::harness::*;
use std::process::{Command, Stdio};
use threadbox_api::{CreateSandboxRequest, LimitsRequest};

/// `(first host uid, count)` of the sandbox's user namespace, read on the host.
fn host_uid_map(d: &Daemon, id: &str) -> (u64, u64) {
    let sb = block(d.client.get(id)).expect("get");
    let pid = sb.agent_pid.expect("agent pid");
    let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).expect("uid_map");
    let f: Vec<u64> = map
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(f.len(), 3, "one line expected: {map}");
    (f[1], f[2])
}

#[test]
fn sandboxes_do_not_start_without_landlock_unless_the_operator_allows_it() {
    if !is_root() {
        eprintln!("skipped: needs root");
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        return;
    }
    let weak = weakened_bins();
    let _s = serial();
    // Positive control: the same build boots sandboxes when Landlock is there.
    let d = Daemon::start(&weak, None);
    d.create(LimitsRequest::default());
    drop(d);

    let d = Daemon::start(&weak, Some("no-landlock-kernel"));
    match block(d.client.create(&CreateSandboxRequest::default())) {
        Ok((sb, _)) => panic!("a sandbox started without Landlock: {sb:?}"),
        Err(e) => assert!(e.to_string().contains("Landlock"), "unclear error: {e}"),
    }
    let listed = block(d.client.list(&Default::default(), None)).expect("list");
    assert!(
        listed.sandboxes.is_empty(),
        "a failed create left {:?}",
        listed.sandboxes
    );
    drop(d);

    // The operator's explicit choice: it starts, and says what is missing.
    let d = Daemon::start_with(
        &weak,
        Some("no-landlock-kernel"),
        &["--insecure-allow-no-landlock"],
    );
    let id = d.create(LimitsRequest::default());
    let sb = block(d.client.get(&id)).expect("get");
    assert!(
        sb.isolation_warnings.iter().any(|w| w.contains("landlock")),
        "sandbox info does not show the weaker posture: {sb:?}"
    );
    let report = block(d.client.selftest(&id)).expect("selftest");
    let ll = report
        .checks
        .iter()
        .find(|c| c.name == "landlock")
        .expect("a landlock check");
    assert!(!ll.ok, "selftest reports Landlock as enforced: {ll:?}");
}

#[test]
fn two_daemons_never_share_host_uids() {
    if !is_root() {
        eprintln!("skipped: needs root");
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        return;
    }
    let bins = normal_bins();
    let _s = serial();
    let a = Daemon::start(&bins, None);
    let b = Daemon::start(&bins, None);
    let ia = a.create(LimitsRequest::default());
    let ib = b.create(LimitsRequest::default());
    let (base_a, n_a) = host_uid_map(&a, &ia);
    let (base_b, n_b) = host_uid_map(&b, &ib);
    // Positive control of the instrument: real maps onto unprivileged host ranges.
    assert!(base_a >= 1_000_000 && base_b >= 1_000_000 && n_a == 65536 && n_b == 65536);
    assert!(
        base_a + n_a <= base_b || base_b + n_b <= base_a,
        "both daemons' first sandboxes map onto host uids {base_a}.. and {base_b}.."
    );

    // A root that records another live root's range (a copy, say) refuses to start.
    let copy = tempfile::Builder::new()
        .prefix("tb-sec-copy-")
        .tempdir()
        .expect("temp root");
    std::fs::copy(
        a.root_path().join("uid-range"),
        copy.path().join("uid-range"),
    )
    .expect("copy the range record");
    let out = Command::new(&bins.threadbox)
        .arg("serve")
        .arg("--root")
        .arg(copy.path())
        .args(["--listen", "127.0.0.1:0"])
        .arg("--agent")
        .arg(&bins.agent)
        .stdin(Stdio::null())
        .output()
        .expect("run serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("also claimed"),
        "a daemon started on a range another root holds: {}\n{err}",
        out.status
    );
}
