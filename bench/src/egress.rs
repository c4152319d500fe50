//! Egress figures (issue 13): what the daemon's data plane costs against the same traffic
//! sent straight from the host to the same upstream.
//!
//! The upstream is a netns of the bench's own (`tbb-<pid>`, veth `10.252.N.1/30` ↔ `.2`)
//! running this binary's `__egress-upstream`: a discard server on 9101 that prints
//! `bytes secs` per connection (timed from the first byte to EOF, on the server's side, so
//! exec overhead is not in the figure) and a one-byte echo on 9102. The daemon resolves
//! `bench.test` to it (`--egress-hosts`) and excepts the /30 from the floor.

use crate::stats::{self, Row};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};
use threadbox_api::{CreateSandboxRequest, ExecRequest};
use threadbox_client::Client;

#[derive(Args, Clone)]
pub struct EgressOpts {
    /// Samples per contender (throughput transfers, creates).
    #[arg(long, default_value_t = 5)]
    iterations: usize,
    /// MiB per throughput sample.
    #[arg(long, default_value_t = 256)]
    mib: usize,
    /// New connections per latency run.
    #[arg(long, default_value_t = 200)]
    connections: usize,
    /// Sandboxes per memory figure.
    #[arg(long, default_value_t = 10)]
    sandboxes: usize,
    /// A few iterations, small sizes: checks the program completes.
    #[arg(long)]
    smoke: bool,
    /// Print the results as one JSON document instead of the table.
    #[arg(long)]
    json: bool,
}

/// The upstream servers (inside the netns): 9101 discard + report, 9102 one-byte echo.
pub fn upstream(addr: &str) -> Result<()> {
    let discard = TcpListener::bind((addr, 9101))?;
    let echo = TcpListener::bind((addr, 9102))?;
    std::thread::spawn(move || {
        for c in echo.incoming().flatten() {
            std::thread::spawn(move || {
                let mut c = c;
                let mut b = [0u8; 1];
                while matches!(c.read(&mut b), Ok(1)) {
                    if c.write_all(&b).is_err() {
                        break;
                    }
                }
            });
        }
    });
    println!("ready");
    std::io::stdout().flush()?;
    for c in discard.incoming().flatten() {
        let mut c = c;
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        let mut start = None;
        while let Ok(n) = c.read(&mut buf) {
            if n == 0 {
                break;
            }
            start.get_or_insert_with(Instant::now);
            total += n as u64;
        }
        let secs = start.map_or(0.0, |s| s.elapsed().as_secs_f64());
        println!("{total} {secs}");
        std::io::stdout().flush()?;
    }
    Ok(())
}

struct Netns {
    ns: String,
    host_if: String,
    net: String,
    server: Option<Child>,
    reports: Option<BufReader<ChildStdout>>,
    _dir: tempfile::TempDir,
    hosts: std::path::PathBuf,
}

fn ip(args: &[&str]) -> Result<()> {
    let ok = Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        bail!("ip {args:?} failed");
    }
    Ok(())
}

impl Netns {
    fn start() -> Result<Netns> {
        let pid = std::process::id();
        let used = crate::sh("ip -o -4 addr show");
        let n = (0..250)
            .map(|i| (pid + i) % 250 + 1)
            .find(|n| !used.contains(&format!(" 10.252.{n}.")))
            .context("no free 10.252.N/30")?;
        let dir = tempfile::Builder::new().prefix("tb-bench-up-").tempdir()?;
        let hosts = dir.path().join("hosts");
        let mut me = Netns {
            ns: format!("tbb-{pid}"),
            host_if: format!("tbbh{pid}"),
            net: format!("10.252.{n}"),
            server: None,
            reports: None,
            _dir: dir,
            hosts,
        };
        let peer = format!("tbbp{pid}");
        let (h, p) = (format!("{}.1/30", me.net), format!("{}.2/30", me.net));
        ip(&["netns", "add", &me.ns])?;
        ip(&[
            "link",
            "add",
            &me.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &peer,
        ])?;
        ip(&["link", "set", &peer, "netns", &me.ns])?;
        ip(&["addr", "add", &h, "dev", &me.host_if])?;
        ip(&["link", "set", &me.host_if, "up"])?;
        ip(&["-n", &me.ns, "addr", "add", &p, "dev", &peer])?;
        ip(&["-n", &me.ns, "link", "set", &peer, "up"])?;
        ip(&["-n", &me.ns, "link", "set", "lo", "up"])?;
        std::fs::write(&me.hosts, format!("{} bench.test\n", me.addr()))?;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &me.ns])
            .arg(std::env::current_exe()?)
            .args(["__egress-upstream", &me.addr()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut out = BufReader::new(child.stdout.take().context("stdout")?);
        me.server = Some(child);
        let mut line = String::new();
        out.read_line(&mut line)?;
        if line.trim() != "ready" {
            bail!("the upstream did not start: {line:?}");
        }
        me.reports = Some(out);
        Ok(me)
    }

    fn addr(&self) -> String {
        format!("{}.2", self.net)
    }

    /// The next transfer's report: Gbit/s.
    fn report(&mut self) -> Result<f64> {
        let mut line = String::new();
        self.reports
            .as_mut()
            .context("no upstream")?
            .read_line(&mut line)?;
        let mut it = line.split_whitespace();
        let bytes: f64 = it.next().context("bytes")?.parse()?;
        let secs: f64 = it.next().context("secs")?.parse()?;
        if secs <= 0.0 {
            bail!("an empty transfer");
        }
        Ok(bytes * 8.0 / secs / 1e9)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = ip(&["netns", "del", &self.ns]);
        let _ = ip(&["link", "del", &self.host_if]);
    }
}

fn policy() -> Result<threadbox_api::network::NetworkPolicySpec> {
    Ok(serde_json::from_value(serde_json::json!({"rules": [
        {"action": "allow", "host": "bench.test", "ports": ["9101", "9102"]}
    ]}))?)
}

fn sandbox(with_policy: bool) -> Result<CreateSandboxRequest> {
    let mut r = CreateSandboxRequest::default();
    r.labels.insert(crate::LABEL.into(), "1".into());
    if with_policy {
        r.network = Some(policy()?);
    }
    Ok(r)
}

async fn exec(client: &Client, id: &str, script: &str) -> Result<String> {
    let r = client
        .exec(
            id,
            &ExecRequest {
                command: Some(vec!["bash".into(), "-c".into(), script.into()]),
                timeout_secs: Some(300.0),
                ..Default::default()
            },
        )
        .await?;
    if r.exit_code != Some(0) {
        bail!("{script:?} failed in the sandbox: {}{}", r.stdout, r.stderr);
    }
    Ok(r.stdout)
}

fn host_sh(script: &str) -> Result<String> {
    let out = Command::new("bash").args(["-c", script]).output()?;
    if !out.status.success() {
        bail!(
            "{script:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Python: `n` new connections to `host`:9102, one byte each way; ms per connection.
fn latency_script(host: &str, n: usize) -> String {
    format!(
        "python3 -c \"
import socket, time
ip = socket.gethostbyname('{host}')
out = []
for _ in range({n}):
    t = time.perf_counter()
    s = socket.create_connection((ip, 9102)); s.sendall(b'x'); s.recv(1); s.close()
    out.append((time.perf_counter() - t) * 1000)
print(' '.join('%.4f' % v for v in out))\""
    )
}

fn samples(text: &str) -> Vec<f64> {
    text.split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect()
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Direct host connections pass this check too (same route), so it proves the upstream
/// answers before anything is timed.
fn probe(addr: &str) -> Result<()> {
    let mut c =
        TcpStream::connect_timeout(&format!("{addr}:9102").parse()?, Duration::from_secs(5))?;
    c.write_all(b"x")?;
    let mut b = [0u8; 1];
    c.read_exact(&mut b)?;
    Ok(())
}

pub async fn run(mut o: EgressOpts) -> Result<()> {
    if o.smoke {
        o.iterations = o.iterations.min(2);
        o.mib = o.mib.min(16);
        o.connections = o.connections.min(20);
        o.sandboxes = o.sandboxes.min(2);
    }
    let mut up = Netns::start()?;
    probe(&up.addr())?;
    let extra = vec![
        "--egress-hosts".to_string(),
        up.hosts.display().to_string(),
        "--egress-allow-private".into(),
        format!("{}.0/30", up.net),
    ];
    let (daemon, url) = crate::start_daemon_with(0, &extra).await?;
    let client = Client::new(&url)?;
    let pid = daemon.child.id();
    let mut rows = Vec::new();

    let sb = client.create(&sandbox(true)?).await?.0.id;
    // Throughput, interleaved: direct, then through the daemon.
    let send = |host: &str| {
        format!(
            "dd if=/dev/zero bs=1M count={} status=none > /dev/tcp/{host}/9101",
            o.mib
        )
    };
    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    for _ in 0..o.iterations {
        host_sh(&send(&up.addr()))?;
        direct.push(up.report()?);
        exec(&client, &sb, &send("bench.test")).await?;
        proxied.push(up.report()?);
    }
    let fig = format!("egress throughput ({} MiB per transfer)", o.mib);
    let base = Row::from_samples(&fig, "direct host→upstream", "Gbit/s", direct);
    rows.push(Row::from_samples(&fig, "sandbox via daemon", "Gbit/s", proxied).against(&base));
    rows.push(base);

    // New-connection latency.
    let host_lat = samples(&host_sh(&latency_script(&up.addr(), o.connections))?);
    let sb_lat = samples(&exec(&client, &sb, &latency_script("bench.test", o.connections)).await?);
    let fig = "egress new connection + 1-byte echo";
    let base = Row::from_samples(fig, "direct host→upstream", "ms", host_lat);
    rows.push(Row::from_samples(fig, "sandbox via daemon", "ms", sb_lat).against(&base));
    rows.push(base);
    client.delete(&sb, true).await?;

    // Create with and without a policy, interleaved.
    let (mut plain, mut with) = (Vec::new(), Vec::new());
    for _ in 0..o.iterations.max(3) {
        for (policy, into) in [(false, &mut plain), (true, &mut with)] {
            let t = Instant::now();
            let id = client.create(&sandbox(policy)?).await?.0.id;
            into.push(stats::ms(t.elapsed()));
            client.delete(&id, true).await?;
        }
    }
    let fig = "create (cold)";
    let base = Row::from_samples(fig, "no policy", "ms", plain);
    rows.push(Row::from_samples(fig, "with a policy", "ms", with).against(&base));
    rows.push(base);

    // Daemon memory per sandbox, with egress (policy attached, one connection made) and
    // without.
    let mut per = Vec::new();
    for policy in [false, true] {
        let before = rss_kib(pid);
        let mut ids = Vec::new();
        for _ in 0..o.sandboxes {
            let id = client.create(&sandbox(policy)?).await?.0.id;
            if policy {
                exec(&client, &id, &latency_script("bench.test", 1)).await?;
            }
            ids.push(id);
        }
        let after = rss_kib(pid);
        per.push(after.saturating_sub(before) as f64 / 1024.0 / o.sandboxes as f64);
        for id in ids {
            client.delete(&id, true).await?;
        }
    }
    let fig = format!("daemon memory per sandbox (N={})", o.sandboxes);
    let base = Row::value(&fig, "no policy", "MiB", per[0], o.sandboxes);
    rows.push(Row::value(&fig, "egress on", "MiB", per[1], o.sandboxes).against(&base));
    rows.push(base);
    drop(daemon);

    if o.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"results": rows}))?
        );
    } else {
        print!("{}", stats::table(&rows));
    }
    Ok(())
}
