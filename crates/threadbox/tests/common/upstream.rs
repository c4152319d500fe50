//! A test upstream for egress tests: its own netns `tbt-up-<pid><k>` joined to the host by
//! a veth pair (host `10.250.N.1/30`, netns `10.250.N.2/30`) running an HTTP server (8080),
//! a TCP sink that records every byte (9000) and a stub DNS resolver that records every name
//! asked (`tests/network/upstream.py`). Verdicts are judged by what reached it, never by a
//! `connect()` that appeared to work. Removed on every path (a guard's `Drop`).

use super::{wait_for, Daemon};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Upstreams made by this process so far: part of the netns name, so that several tests
/// of one binary never share one.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// A `10.250.N` no interface of the host uses yet: test binaries (and several checkouts)
/// run at once, and two veths on one subnet would route each other's packets.
fn free_subnet(pid: u32, k: u32) -> u32 {
    let used = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    (0..250)
        .map(|i| (pid.wrapping_mul(31).wrapping_add(k * 7 + i)) % 250 + 1)
        .find(|n| !used.contains(&format!(" 10.250.{n}.")))
        .expect("no free 10.250.N/30 for a test upstream")
}

pub const DEADLINE: Duration = Duration::from_secs(30);

/// The upstream netns, its veth and the servers in it.
pub struct Upstream {
    pub ns: String,
    host_if: String,
    server: Option<Child>,
    pub dir: tempfile::TempDir,
    /// `10.250.N`
    pub net: String,
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Upstream {
    pub fn start() -> Upstream {
        let pid = std::process::id();
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let n = free_subnet(pid, k);
        let pid = format!("{pid}{k}");
        let mut up = Upstream {
            ns: format!("tbt-up-{pid}"),
            host_if: format!("tbth{pid}"),
            server: None,
            dir: tempfile::Builder::new()
                .prefix("tbt-up-")
                .tempdir()
                .expect("temp dir"),
            net: format!("10.250.{n}"),
        };
        let peer = format!("tbtp{pid}");
        let (host_addr, ns_addr) = (format!("{}.1/30", up.net), format!("{}.2/30", up.net));
        // `up` is built first so that its Drop cleans up whatever part of this was made.
        for args in [
            vec!["netns", "add", &up.ns],
            vec![
                "link",
                "add",
                &up.host_if,
                "type",
                "veth",
                "peer",
                "name",
                &peer,
            ],
            vec!["link", "set", &peer, "netns", &up.ns],
            vec!["addr", "add", &host_addr, "dev", &up.host_if],
            vec!["link", "set", &up.host_if, "up"],
            vec!["-n", &up.ns, "addr", "add", &ns_addr, "dev", &peer],
            vec!["-n", &up.ns, "link", "set", &peer, "up"],
            vec!["-n", &up.ns, "link", "set", "lo", "up"],
        ] {
            assert!(ip(&args), "ip {args:?} failed");
        }
        super::tls::write_tls(up.dir.path());
        let script = up.dir.path().join("upstream.py");
        std::fs::write(&script, include_str!("../network/upstream.py")).expect("write script");
        let server = Command::new("ip")
            .args(["netns", "exec", &up.ns, "python3"])
            .arg(&script)
            .arg(up.addr())
            .arg(up.dir.path())
            .stdin(Stdio::null())
            .spawn()
            .expect("start the upstream servers");
        up.server = Some(server);
        let ready = up.dir.path().join("ready");
        wait_for("the upstream servers", DEADLINE, || ready.exists());
        up
    }

    /// The upstream's address (netns side).
    pub fn addr(&self) -> String {
        format!("{}.2", self.net)
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read(self.dir.path().join(name))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The upstream's test CA (PEM): its HTTPS server (443) is signed by it; the daemon
    /// trusts it with `--egress-upstream-ca`, sandboxes never do.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("tls-ca.pem")
    }

    /// Adds `cidr` to the host's end of the veth (gone with the veth): an address of the
    /// host's own, as the floor tests need.
    pub fn add_host_addr(&self, cidr: &str) {
        assert!(
            ip(&["addr", "add", cidr, "dev", &self.host_if]),
            "ip addr add {cidr} failed"
        );
    }

    pub fn hosts_file(&self) -> PathBuf {
        let p = self.dir.path().join("hosts");
        std::fs::write(&p, format!("{} api.test\n", self.addr())).expect("write hosts");
        p
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Deleting the netns also deletes its end of the veth, and with it the host end;
        // the host end is deleted on its own too, in case the netns was never made.
        let _ = ip(&["netns", "del", &self.ns]);
        let _ = ip(&["link", "del", &self.host_if]);
    }
}

pub fn daemon(up: &Upstream, allow_private: bool) -> Daemon {
    daemon_with(up, allow_private, &[])
}

/// [`daemon`] with more `serve` arguments.
pub fn daemon_with(up: &Upstream, allow_private: bool, extra: &[&str]) -> Daemon {
    let hosts = up.hosts_file();
    let private = format!("{}.0/30", up.net);
    let dns = format!("{}:53", up.addr());
    let mut args = vec![
        "--egress-hosts",
        hosts.to_str().expect("utf-8 path"),
        "--egress-dns",
        &dns,
    ];
    if allow_private {
        args.extend(["--egress-allow-private", &private]);
    }
    args.extend(extra);
    Daemon::start_with(&args)
}
