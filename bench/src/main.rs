//! threadbox-bench: threadbox against the sandboxes people would pick instead, measured in
//! one run. Contenders are interleaved (A B A B ...) so machine drift affects all alike,
//! and every figure is reported as p50/p90/p99 with the ratio to a baseline of the same run.
//!
//! ```text
//! threadbox-bench setup                         # apt: bubblewrap, runc, runsc
//! threadbox-bench all [--iterations 50] [--json] [--markdown docs/performance.md]
//! threadbox-bench all --smoke --json            # CI: a few iterations, valid JSON
//! threadbox-bench figures                       # create, exec, pause/resume only
//! threadbox-bench all --url unix:///var/lib/threadbox/threadbox.sock
//! ```
//!
//! (Over 600 lines: one program whose figures share the same sampling, interleaving and
//! report code; each figure is a short function.)
#![forbid(unsafe_code)]

mod baselines;
mod density;
mod egress;
mod fork;
mod hibernate;
mod interp;
mod layers;
mod stats;
mod tiers;
mod tracing;

use anyhow::{bail, Context, Result};
use baselines::{bare, Bwrap, Oci};
use clap::{Args, Parser, Subcommand};
use serde_json::json;
use stats::{ms, Row};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use threadbox_api::{CreateSandboxRequest, ExecRequest, StartProcessRequest};
use threadbox_client::Client;

#[derive(Parser)]
#[command(about = "threadbox benchmarks: figures and ratios against baselines in the same run")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Installs the baselines with apt-get (bubblewrap, runc, runsc).
    Setup,
    /// Every figure: time to interactive, exec round trip, pause/resume, density,
    /// throughput, noisy neighbour.
    All(Opts),
    /// Time to interactive, exec round trip and pause/resume only.
    Figures(Opts),
    /// Egress (issue 13): throughput and new-connection latency through the daemon against
    /// direct host→upstream, create with and without a policy, memory per sandbox.
    Egress(egress::EgressOpts),
    /// Internal: the egress figures' upstream servers (run inside their netns).
    #[command(hide = true, name = "__egress-upstream")]
    EgressUpstream { addr: String },
    /// Interpreter contexts only: create, `1+1` against `exec python3 -c`, a PNG round
    /// trip, and ipykernel in a venv when it installs (issue 15).
    Interpreter(Opts),
    /// Tracing (issue 17): exec and create with OTLP export on against off, interleaved.
    Tracing(tracing::TracingOpts),
    /// Tiers (issue 16): create→first result and exec round trip on gvisor against the
    /// jail, interleaved.
    Tiers(tiers::TiersOpts),
    /// Hibernate (issue 16): hibernate and wake p50 per tier, the memory image's size,
    /// host RAM of a hibernated sandbox against a paused one.
    Hibernate(hibernate::HibernateOpts),
    /// Fork of 3 with memory (issue 16): on gvisor with memory against the jail's
    /// disk-only fork, interleaved: the call, until every copy answers, the parent's stall.
    Fork(fork::ForkOpts),
    /// Density (issue 16): memory, swap and disk per sandbox running, paused and
    /// hibernated, per tier, in one run (makes and removes a swap file for the jail).
    Density(density::DensityOpts),
    /// Layer store (issue 14): checkpoint of a sandbox holding 200 MB of files and its
    /// frozen instant, fork of 3 cold against staged slots, rewind, and image pull against
    /// `skopeo copy` from the same local registry, in one run.
    Layers(layers::LayersOpts),
}

/// Which figures a run measures.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Which {
    All,
    Figures,
    Interpreter,
}

#[derive(Args, Clone)]
struct Opts {
    /// Samples per contender for latency figures.
    #[arg(long, default_value_t = 50)]
    iterations: usize,
    /// A few iterations, small N, short runs: checks the program completes (CI).
    #[arg(long)]
    smoke: bool,
    /// Daemon to measure; without it a daemon is started on a temporary root.
    #[arg(long)]
    url: Option<String>,
    /// Print the results as one JSON document instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write the results as a Markdown report (e.g. docs/performance.md).
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Sandbox counts for the density figure.
    #[arg(long, value_delimiter = ',', default_value = "50,200,500")]
    density: Vec<usize>,
    /// Concurrent clients for the throughput figure.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    clients: Vec<usize>,
    /// Seconds per throughput level.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// Baselines not to run (bwrap, runc, runsc, ipykernel).
    #[arg(long, value_delimiter = ',')]
    skip: Vec<String>,
    /// Size of the warm pool of the second daemon measured by "threadbox jail, warm
    /// pool" (started with `serve --warm-pool N`); 0 leaves that contender out.
    #[arg(long, default_value_t = 2)]
    warm_pool: usize,
    /// A running daemon with a warm pool to measure (with --url); without it and without
    /// --url, one is started on a temporary root.
    #[arg(long)]
    pool_url: Option<String>,
}

/// Samples of one contender; a contender that fails stops and is reported as skipped.
struct Series {
    name: String,
    samples: Vec<f64>,
    failed: Option<String>,
}

impl Series {
    fn new(name: &str) -> Series {
        Series {
            name: name.into(),
            samples: Vec::new(),
            failed: None,
        }
    }
    fn absent(name: &str, why: &str) -> Series {
        Series {
            failed: Some(why.into()),
            ..Series::new(name)
        }
    }
    fn live(&self) -> bool {
        self.failed.is_none()
    }
    fn push(&mut self, r: Result<f64>) {
        match r {
            Ok(v) => self.samples.push(v),
            Err(e) => self.failed = Some(format!("failed during the run: {e:#}")),
        }
    }
    fn row(self, figure: &str, unit: &str) -> Row {
        match self.failed {
            Some(why) => Row::skipped(figure, &self.name, unit, &why),
            None => Row::from_samples(figure, &self.name, unit, self.samples),
        }
    }
}

/// The baseline row first, then each other contender against it.
fn rows_against(figure: &str, unit: &str, base: Series, others: Vec<Series>) -> Vec<Row> {
    let b = base.row(figure, unit);
    let mut v: Vec<Row> = others
        .into_iter()
        .map(|s| s.row(figure, unit).against(&b))
        .collect();
    v.push(b);
    v
}

struct OwnDaemon {
    child: Child,
    _root: tempfile::TempDir,
}

impl Drop for OwnDaemon {
    /// SIGTERM, so the daemon removes its warm pool; SIGKILL if it does not exit.
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(20));
    }
}

/// SIGTERM to `child`, then SIGKILL if it has not exited within `grace`.
fn terminate(child: &mut Child, grace: Duration) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

async fn start_daemon(warm_pool: usize) -> Result<(OwnDaemon, String)> {
    start_daemon_with(warm_pool, &[]).await
}

/// [`start_daemon`] with more `serve` flags (the egress figures' upstream).
async fn start_daemon_with(warm_pool: usize, extra: &[String]) -> Result<(OwnDaemon, String)> {
    start_daemon_io(warm_pool, extra, None).await
}

/// [`start_daemon_with`], its log (stderr) written to `log` when given: figures the
/// daemon only logs (the fork benchmark's parent stand-still) are read from there.
async fn start_daemon_io(
    warm_pool: usize,
    extra: &[String],
    log: Option<&std::path::Path>,
) -> Result<(OwnDaemon, String)> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("no exe dir")?;
    // `cargo test` runs the binary from target/<profile>/ too; deps/ is one level down.
    let bin: PathBuf = [dir.join("threadbox"), dir.join("../threadbox")]
        .into_iter()
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "no threadbox binary next to {}: build the workspace first",
                exe.display()
            )
        })?;
    let root = tempfile::Builder::new().prefix("tb-bench-").tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let stderr = match log {
        Some(p) => Stdio::from(
            std::fs::File::create(p).with_context(|| format!("create {}", p.display()))?,
        ),
        None => Stdio::null(),
    };
    let child = Command::new(&bin)
        .args(["serve", "--root"])
        .arg(root.path())
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--warm-pool", &warm_pool.to_string()])
        .args(extra)
        // Plain text: the log is parsed, not read by a person.
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()?;
    let url = format!("unix://{}/threadbox.sock", root.path().display());
    let client = Client::new(&url)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if client.health().await.is_ok() {
            break;
        }
        if Instant::now() > deadline {
            bail!("the daemon did not come up");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((OwnDaemon { child, _root: root }, url))
}

/// Every sandbox of a run carries this label, so a failed run removes what it made.
const LABEL: &str = "threadbox-bench";

fn bench_sandbox() -> CreateSandboxRequest {
    let mut r = CreateSandboxRequest::default();
    r.labels.insert(LABEL.into(), "1".into());
    r
}

fn exec_req(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        command: Some(argv.iter().map(|s| s.to_string()).collect()),
        ..Default::default()
    }
}

async fn tb_exec(client: &Client, id: &str, argv: &[&str]) -> Result<f64> {
    let t = Instant::now();
    let r = client.exec(id, &exec_req(argv)).await?;
    let el = t.elapsed();
    if r.exit_code != Some(0) {
        bail!("{argv:?} failed in the sandbox: {}", r.stderr);
    }
    Ok(ms(el))
}

struct Bench {
    client: Client,
    /// A daemon with a warm pool (contender "threadbox jail, warm pool").
    pool: std::result::Result<Client, String>,
    iters: usize,
    opts: Opts,
    bwrap: std::result::Result<Bwrap, String>,
    runc: std::result::Result<Oci, String>,
    runsc: std::result::Result<Oci, String>,
    rows: Vec<Row>,
    _work: tempfile::TempDir,
}

const ECHO: &[&str] = &["echo", "ok"];
const POOL_CONTENDER: &str = "threadbox jail, warm pool";
const PY_PRINT: &[&str] = &["/usr/bin/python3", "-c", "print(1)"];
const TRUE: &[&str] = &["true"];
const PY_PASS: &[&str] = &["/usr/bin/python3", "-c", "pass"];

impl Bench {
    fn skipped(&self, which: &str) -> bool {
        self.opts.skip.iter().any(|s| s == which)
    }

    /// Time to interactive: create a sandbox → first result of a command.
    async fn time_to_interactive(&mut self) -> Result<()> {
        for (label, argv) in [("echo ok", ECHO), ("python3 -c 'print(1)'", PY_PRINT)] {
            let figure = format!("create→first result ({label})");
            let mut base = Series::new("bare fork+exec");
            let mut bw = match &self.bwrap {
                Ok(_) => Series::new("bwrap --unshare-all"),
                Err(e) => Series::absent("bwrap --unshare-all", e),
            };
            let mut rc = match &self.runc {
                Ok(_) => Series::new("runc run"),
                Err(e) => Series::absent("runc run", e),
            };
            let mut rs = match &self.runsc {
                Ok(_) => Series::new("runsc run (ptrace)"),
                Err(e) => Series::absent("runsc run (ptrace)", e),
            };
            let mut tb = Series::new("threadbox jail");
            let mut tp = match &self.pool {
                Ok(_) => Series::new(POOL_CONTENDER),
                Err(e) => Series::absent(POOL_CONTENDER, e),
            };
            for i in 0..self.iters {
                // The order rotates each round: no contender always follows the same one
                // (runsc leaves work behind it that would slow down whoever comes next).
                for k in rotation(i, 6) {
                    match k {
                        0 => base.push(bare(argv)),
                        1 => {
                            if let (true, Ok(b)) = (bw.live(), &self.bwrap) {
                                bw.push(b.run(argv));
                            }
                        }
                        2 => {
                            if let (true, Ok(r)) = (rc.live(), &mut self.runc) {
                                rc.push(r.run(argv));
                            }
                        }
                        3 => {
                            if let (true, Ok(r)) = (rs.live(), &mut self.runsc) {
                                rs.push(r.run(argv));
                            }
                        }
                        4 => {
                            let t = Instant::now();
                            let (sb, _) = self.client.create(&bench_sandbox()).await?;
                            let r = tb_exec(&self.client, &sb.id, argv).await;
                            tb.push(r.map(|_| ms(t.elapsed())));
                            self.client.delete(&sb.id, true).await?;
                        }
                        _ => {
                            // The pool refills in the background between rounds; a create
                            // that finds it empty boots cold and is counted as it is.
                            if let (true, Ok(c)) = (tp.live(), &self.pool) {
                                let t = Instant::now();
                                let (sb, _) = c.create(&bench_sandbox()).await?;
                                let r = tb_exec(c, &sb.id, argv).await;
                                tp.push(r.map(|_| ms(t.elapsed())));
                                c.delete(&sb.id, true).await?;
                            }
                        }
                    }
                }
            }
            self.rows
                .extend(rows_against(&figure, "ms", base, vec![tb, tp, bw, rc, rs]));
        }
        Ok(())
    }

    /// Exec round trip in a running sandbox, and pause/resume.
    async fn exec_and_pause(&mut self) -> Result<()> {
        let (sb, _) = self.client.create(&bench_sandbox()).await?;
        let runc_id = match &mut self.runc {
            Ok(r) => r.start_sleeper().map_err(|e| format!("{e:#}")),
            Err(e) => Err(e.clone()),
        };
        let runsc_id = match &mut self.runsc {
            Ok(r) => r.start_sleeper().map_err(|e| format!("{e:#}")),
            Err(e) => Err(e.clone()),
        };
        for (label, argv) in [("true", TRUE), ("python3 -c pass", PY_PASS)] {
            let figure = format!("exec round trip ({label})");
            let mut base = Series::new("bare fork+exec");
            let mut tb = Series::new("threadbox API");
            let mut rc = match &runc_id {
                Ok(_) => Series::new("runc exec"),
                Err(e) => Series::absent("runc exec", e),
            };
            let mut rs = match &runsc_id {
                Ok(_) => Series::new("runsc exec (ptrace)"),
                Err(e) => Series::absent("runsc exec (ptrace)", e),
            };
            tb_exec(&self.client, &sb.id, argv).await?; // warm the page cache
            for i in 0..self.iters {
                for k in rotation(i, 4) {
                    match k {
                        0 => base.push(bare(argv)),
                        1 => {
                            if let (true, Ok(r), Ok(id)) = (rc.live(), &self.runc, &runc_id) {
                                rc.push(r.exec(id, argv));
                            }
                        }
                        2 => {
                            if let (true, Ok(r), Ok(id)) = (rs.live(), &self.runsc, &runsc_id) {
                                rs.push(r.exec(id, argv));
                            }
                        }
                        _ => tb.push(tb_exec(&self.client, &sb.id, argv).await),
                    }
                }
            }
            self.rows
                .extend(rows_against(&figure, "ms", base, vec![tb, rc, rs]));
        }

        let mut tp = Series::new("threadbox API");
        let mut tr = Series::new("threadbox API");
        let (mut rp, mut rr) = match &runc_id {
            Ok(_) => (Series::new("runc pause"), Series::new("runc resume")),
            Err(e) => (
                Series::absent("runc pause", e),
                Series::absent("runc resume", e),
            ),
        };
        for _ in 0..self.iters {
            let t = Instant::now();
            let r = self.client.pause(&sb.id).await;
            tp.push(r.map(|_| ms(t.elapsed())).map_err(Into::into));
            let t = Instant::now();
            let r = self.client.resume(&sb.id).await;
            tr.push(r.map(|_| ms(t.elapsed())).map_err(Into::into));
            if let (true, Ok(r), Ok(id)) = (rp.live(), &self.runc, &runc_id) {
                rp.push(r.pause(id));
                rr.push(r.resume(id));
            }
        }
        // No bare equivalent: the goal is absolute (≤ 10 ms); runc is the reference.
        for (figure, base, ours) in [("pause", rp, tp), ("resume", rr, tr)] {
            if base.live() {
                self.rows
                    .extend(rows_against(figure, "ms", base, vec![ours]));
            } else {
                self.rows.push(ours.row(figure, "ms"));
                self.rows.push(base.row(figure, "ms"));
            }
        }
        if let (Ok(r), Ok(id)) = (&mut self.runc, &runc_id) {
            let _ = r.delete(id);
        }
        if let (Ok(r), Ok(id)) = (&mut self.runsc, &runsc_id) {
            let _ = r.delete(id);
        }
        self.client.delete(&sb.id, true).await?;
        Ok(())
    }

    /// Host memory per idle sandbox: N threadbox sandboxes, then N runc containers with a
    /// sleeping process. Reported twice: the drop of MemAvailable (everything the host
    /// spends, noisy on a shared machine) and the memory charged to the sandboxes' cgroups.
    async fn density(&mut self) -> Result<()> {
        let mib = |b: f64| b / (1024.0 * 1024.0);
        for &n in &self.opts.density.clone() {
            let figure = format!("host memory per idle sandbox (N={n})");
            settle().await;
            let before = baselines::host_used()?;
            let mut ids = Vec::new();
            let mut pids = Vec::new();
            let mut failed = None;
            for _ in 0..n {
                match self.client.create(&bench_sandbox()).await {
                    Ok((sb, _)) => {
                        pids.extend(sb.agent_pid);
                        ids.push(sb.id);
                    }
                    Err(e) => {
                        failed = Some(format!("create #{} failed: {e}", ids.len() + 1));
                        break;
                    }
                }
            }
            settle().await;
            let after = baselines::host_used()?;
            let charged: u64 = pids
                .iter()
                .filter_map(|p| baselines::cgroup_memory(*p))
                .sum();
            for id in &ids {
                let _ = self.client.delete(id, true).await;
            }
            let (tb_host, tb_cg) = match failed {
                Some(why) => (
                    Row::skipped(&figure, "threadbox (MemAvailable Δ)", "MiB", &why),
                    Row::skipped(&figure, "threadbox (cgroup-charged)", "MiB", &why),
                ),
                None => (
                    Row::value(
                        &figure,
                        "threadbox (MemAvailable Δ)",
                        "MiB",
                        mib(after as f64 - before as f64) / n as f64,
                        n,
                    ),
                    Row::value(
                        &figure,
                        "threadbox (cgroup-charged)",
                        "MiB",
                        mib(charged as f64) / n as f64,
                        n,
                    ),
                ),
            };

            let (rc_host, rc_cg) = match &mut self.runc {
                Err(e) => (
                    Row::skipped(&figure, "runc sleep (MemAvailable Δ)", "MiB", e),
                    Row::skipped(&figure, "runc sleep (cgroup-charged)", "MiB", e),
                ),
                Ok(r) => {
                    settle().await;
                    let before = baselines::host_used()?;
                    let mut ids = Vec::new();
                    let mut failed = None;
                    for _ in 0..n {
                        match r.start_sleeper() {
                            Ok(id) => ids.push(id),
                            Err(e) => {
                                failed =
                                    Some(format!("container #{} failed: {e:#}", ids.len() + 1));
                                break;
                            }
                        }
                    }
                    settle().await;
                    let after = baselines::host_used()?;
                    let charged: u64 = ids
                        .iter()
                        .filter_map(|id| r.pid(id).ok())
                        .filter_map(baselines::cgroup_memory)
                        .sum();
                    r.delete_all();
                    match failed {
                        Some(why) => (
                            Row::skipped(&figure, "runc sleep (MemAvailable Δ)", "MiB", &why),
                            Row::skipped(&figure, "runc sleep (cgroup-charged)", "MiB", &why),
                        ),
                        None => (
                            Row::value(
                                &figure,
                                "runc sleep (MemAvailable Δ)",
                                "MiB",
                                mib(after as f64 - before as f64) / n as f64,
                                n,
                            ),
                            Row::value(
                                &figure,
                                "runc sleep (cgroup-charged)",
                                "MiB",
                                mib(charged as f64) / n as f64,
                                n,
                            ),
                        ),
                    }
                }
            };
            let tb_host = if rc_host.skipped.is_none() {
                tb_host.against(&rc_host)
            } else {
                tb_host
            };
            let tb_cg = if rc_cg.skipped.is_none() {
                tb_cg.against(&rc_cg)
            } else {
                tb_cg
            };
            self.rows.extend([tb_host, tb_cg, rc_host, rc_cg]);
        }
        Ok(())
    }

    /// Trivial execs per second with C concurrent clients, each on its own sandbox,
    /// against C threads doing bare fork+exec of `true`.
    async fn throughput(&mut self) -> Result<()> {
        let max = self.opts.clients.iter().copied().max().unwrap_or(1);
        let mut sbs = Vec::new();
        for _ in 0..max {
            sbs.push(
                self.client
                    .create(&CreateSandboxRequest::default())
                    .await?
                    .0
                    .id,
            );
        }
        let dur = Duration::from_secs_f64(self.opts.duration);
        for &c in &self.opts.clients.clone() {
            let figure = format!("throughput: exec true, {c} clients");
            // Bare: c threads.
            let t0 = Instant::now();
            let handles: Vec<_> = (0..c)
                .map(|_| {
                    std::thread::spawn(move || {
                        let mut lat = Vec::new();
                        while t0.elapsed() < dur {
                            if let Ok(v) = bare(TRUE) {
                                lat.push(v);
                            }
                        }
                        lat
                    })
                })
                .collect();
            let mut blat: Vec<f64> = Vec::new();
            for h in handles {
                blat.extend(h.join().unwrap_or_default());
            }
            let bare_rate = blat.len() as f64 / t0.elapsed().as_secs_f64();

            let t0 = Instant::now();
            let mut tasks = Vec::new();
            for id in sbs.iter().take(c) {
                let (client, id) = (self.client.clone(), id.clone());
                tasks.push(tokio::spawn(async move {
                    let mut lat = Vec::new();
                    let mut err = None;
                    while t0.elapsed() < dur {
                        match tb_exec(&client, &id, TRUE).await {
                            Ok(v) => lat.push(v),
                            Err(e) => {
                                err = Some(format!("{e:#}"));
                                break;
                            }
                        }
                    }
                    (lat, err)
                }));
            }
            let mut tlat = Vec::new();
            let mut terr = None;
            for t in tasks {
                let (l, e) = t.await?;
                tlat.extend(l);
                terr = terr.or(e);
            }
            let tb_rate = tlat.len() as f64 / t0.elapsed().as_secs_f64();
            let lat_note = |mut v: Vec<f64>| {
                v.sort_by(|a, b| a.total_cmp(b));
                format!(
                    "latency p50 {:.2} ms, p99 {:.2} ms",
                    stats::percentile(&v, 0.5),
                    stats::percentile(&v, 0.99)
                )
            };
            let b = Row::value(&figure, "bare fork+exec", "execs/s", bare_rate, blat.len())
                .note(lat_note(blat));
            let t = match terr {
                Some(e) => Row::skipped(&figure, "threadbox API", "execs/s", &e),
                None => Row::value(&figure, "threadbox API", "execs/s", tb_rate, tlat.len())
                    .note(lat_note(tlat))
                    .against(&b),
            };
            self.rows.extend([t, b]);
        }
        for id in sbs {
            let _ = self.client.delete(&id, true).await;
        }
        Ok(())
    }

    /// p99 exec latency of sandbox A while sandbox B (default limits) misbehaves.
    async fn noisy_neighbour(&mut self) -> Result<()> {
        let figure = "noisy neighbour: exec true in A";
        let a = self
            .client
            .create(&CreateSandboxRequest::default())
            .await?
            .0
            .id;
        let n = (self.iters * 2).max(3);
        let scenarios: [(&str, Option<&str>); 4] = [
            ("B idle", None),
            ("B fork-bombs", Some("f() { f | f & }; f")),
            (
                "B memory-bombs",
                Some("while :; do python3 -c 'a = []\nwhile True: a.append(bytearray(1 << 24))'; done"),
            ),
            (
                "B spins (4 loops)",
                Some("for i in 1 2 3 4; do (while :; do :; done) & done; wait"),
            ),
        ];
        let mut series = Vec::new();
        for (name, script) in scenarios {
            let b = self
                .client
                .create(&CreateSandboxRequest::default())
                .await?
                .0
                .id;
            let mut s = Series::new(name);
            let started = match script {
                Some(sh) => self
                    .client
                    .start_process(
                        &b,
                        &StartProcessRequest {
                            command: None,
                            shell: Some(sh.into()),
                            env: Default::default(),
                            cwd: None,
                            user: Default::default(),
                        },
                    )
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                None => Ok(()),
            };
            match started {
                Err(e) => s.failed = Some(format!("could not start B: {e}")),
                Ok(()) => {
                    tokio::time::sleep(Duration::from_millis(if self.opts.smoke {
                        200
                    } else {
                        1000
                    }))
                    .await;
                    for _ in 0..n {
                        s.push(tb_exec(&self.client, &a, TRUE).await);
                    }
                }
            }
            let _ = self.client.delete(&b, true).await;
            series.push(s);
        }
        let base = series.remove(0);
        let mut rows = rows_against(figure, "ms", base, series);
        let b99 = rows.last().and_then(|r| r.p99);
        for r in rows.iter_mut() {
            if let (Some(p), Some(b), Some(_)) = (r.p99, b99, &r.baseline) {
                r.note = Some(format!("p99 {:.2}× of B idle", p / b));
            }
        }
        self.rows.extend(rows);
        self.client.delete(&a, true).await?;
        Ok(())
    }
}

/// Contender indices 0..n, starting at a different one each round.
fn rotation(round: usize, n: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (k + round) % n)
}

/// Lets the page cache and deferred frees settle before reading MemAvailable.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(500)).await;
}

fn sh(cmd: &str) -> String {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn machine() -> serde_json::Value {
    let cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2");
    json!({
        "kernel": sh("uname -r"),
        "os": sh(". /etc/os-release && echo \"$PRETTY_NAME\""),
        "cpu": cpu.trim(),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "memory": sh("grep MemTotal /proc/meminfo | awk '{printf \"%.1f GiB\", $2/1048576}'"),
        "virtualization": sh("systemd-detect-virt 2>/dev/null || ( [ -f /.dockerenv ] && echo container )"),
        "runc": sh("runc --version 2>/dev/null | head -1"),
        "runsc": sh("runsc --version 2>/dev/null | head -1"),
        "bwrap": sh("bwrap --version 2>/dev/null"),
        "date": sh("date -u +%Y-%m-%dT%H:%MZ"),
    })
}

/// Where threadbox stands against the goals of issue 7.
fn goals(rows: &[Row]) -> Vec<serde_json::Value> {
    let find = |fig: &str, who: &str| {
        rows.iter()
            .find(|r| r.figure == fig && r.contender == who && r.skipped.is_none())
    };
    let mut g = Vec::new();
    let mut goal = |name: &str, target: &str, v: Option<f64>, ok: fn(f64) -> bool, fmt: &str| {
        g.push(json!({
            "goal": name,
            "target": target,
            "measured": v.map(|x| format!("{x:.2}{fmt}")),
            "met": v.map(ok),
        }));
    };
    // With a warm pool when one was measured (issue 7), else the cold boot.
    let (tti_who, tti) = match find("create→first result (echo ok)", POOL_CONTENDER) {
        Some(r) => ("warm pool", Some(r)),
        None => (
            "cold",
            find("create→first result (echo ok)", "threadbox jail"),
        ),
    };
    goal(
        &format!("time to interactive (echo ok, {tti_who}), p50 ratio to bare"),
        "≤ 1.5×",
        tti.and_then(|r| r.ratio),
        |x| x <= 1.5,
        "×",
    );
    goal(
        "exec round trip (true), p50 ratio to bare",
        "≤ 1.2×",
        find("exec round trip (true)", "threadbox API").and_then(|r| r.ratio),
        |x| x <= 1.2,
        "×",
    );
    goal(
        "pause, p50",
        "≤ 10 ms",
        find("pause", "threadbox API").and_then(|r| r.p50),
        |x| x <= 10.0,
        " ms",
    );
    goal(
        "resume, p50",
        "≤ 10 ms",
        find("resume", "threadbox API").and_then(|r| r.p50),
        |x| x <= 10.0,
        " ms",
    );
    // The larger of the two measures of the largest N: MemAvailable moves with whatever
    // else runs on the machine, the cgroup charge misses kernel memory outside it.
    let dens = rows
        .iter()
        .filter(|r| r.contender.starts_with("threadbox (") && r.skipped.is_none())
        .filter(|r| r.figure.starts_with("host memory"))
        .max_by(|a, b| {
            (a.n, a.p50.unwrap_or(0.0))
                .partial_cmp(&(b.n, b.p50.unwrap_or(0.0)))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
    goal(
        &format!(
            "host memory per idle sandbox{}",
            dens.map(|r| format!(" (N={})", r.n)).unwrap_or_default()
        ),
        "≤ 4 MiB",
        dens.and_then(|r| r.p50),
        |x| x <= 4.0,
        " MiB",
    );
    g
}

fn markdown_report(doc: &serde_json::Value, rows: &[Row], command: &str) -> String {
    let m = &doc["machine"];
    let mut s = String::from(
        "# Performance\n\nWritten by `threadbox-bench` (bench/); regenerate it with the command \
         below. Every figure interleaves the contenders (A B A B …) in one run, so machine \
         drift affects all alike; ratios are p50 against the baseline row of the same figure \
         (bare fork+exec unless the figure says otherwise). The machine is shared with other \
         work, so absolute numbers move between runs; ratios move much less.\n\n",
    );
    s.push_str(&format!("## Reproduce\n\n```sh\ncargo build --release -p threadbox -p threadbox-agent -p threadbox-bench\n./target/release/threadbox-bench setup   # apt: bubblewrap, runc, runsc\n{command}\n```\n\n"));
    s.push_str("## Machine\n\n");
    for k in [
        "date",
        "os",
        "kernel",
        "cpu",
        "cpus",
        "memory",
        "virtualization",
        "runc",
        "runsc",
        "bwrap",
    ] {
        let v = match &m[k] {
            serde_json::Value::String(x) => x.clone(),
            other => other.to_string(),
        };
        s.push_str(&format!("- {k}: {v}\n"));
    }
    s.push_str(
        "\n## Goals (issue 7)\n\n| goal | target | measured | met |\n| --- | --- | --- | --- |\n",
    );
    for g in doc["goals"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            g["goal"].as_str().unwrap_or(""),
            g["target"].as_str().unwrap_or(""),
            g["measured"].as_str().unwrap_or("-"),
            match g["met"].as_bool() {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            }
        ));
    }
    s.push_str(&format!(
        "\n## Results ({} iterations per latency figure)\n\n",
        doc["iterations"]
    ));
    s.push_str(&stats::markdown(rows));
    s
}

async fn measure(b: &mut Bench, which: Which) -> Result<()> {
    let progress = |what: &str| eprintln!("threadbox-bench: {what}");
    if which == Which::Interpreter {
        progress("interpreter contexts");
        return b.interpreter().await;
    }
    let only_figures = which == Which::Figures;
    progress("time to interactive");
    b.time_to_interactive().await?;
    progress("exec round trip, pause/resume");
    b.exec_and_pause().await?;
    if !only_figures {
        progress("density");
        b.density().await?;
        progress("throughput");
        b.throughput().await?;
        progress("noisy neighbour");
        b.noisy_neighbour().await?;
        progress("interpreter contexts");
        b.interpreter().await?;
    }
    Ok(())
}

async fn run(mut opts: Opts, which: Which) -> Result<()> {
    if which == Which::Interpreter {
        // Only threadbox and ipykernel are measured: no OCI baselines, no pool daemon.
        opts.warm_pool = 0;
        opts.skip
            .extend(["bwrap", "runc", "runsc"].map(String::from));
    }
    if opts.smoke {
        opts.iterations = opts.iterations.min(3);
        opts.density = vec![3];
        opts.clients = vec![1, 2];
        opts.duration = opts.duration.min(0.3);
    }
    let iters = opts.iterations.max(1);
    let (_own, url) = match &opts.url {
        Some(u) => (None, u.clone()),
        None => {
            let (d, u) = start_daemon(0).await?;
            (Some(d), u)
        }
    };
    let (_own_pool, pool) = match (&opts.pool_url, &opts.url) {
        _ if opts.warm_pool == 0 => (None, Err("disabled with --warm-pool 0".to_string())),
        (Some(u), _) => (None, Client::new(u).map_err(|e| format!("{e:#}"))),
        (None, Some(_)) => (
            None,
            Err("no daemon with a warm pool given (--pool-url)".to_string()),
        ),
        (None, None) => {
            let (d, u) = start_daemon(opts.warm_pool).await?;
            (Some(d), Client::new(&u).map_err(|e| format!("{e:#}")))
        }
    };
    let work = tempfile::Builder::new().prefix("tb-bench-oci-").tempdir()?;
    let skip_why = "skipped with --skip".to_string();
    let mut b = Bench {
        client: Client::new(&url)?,
        pool,
        iters,
        bwrap: Err(skip_why.clone()),
        runc: Err(skip_why.clone()),
        runsc: Err(skip_why),
        rows: Vec::new(),
        opts: opts.clone(),
        _work: work,
    };
    if !b.skipped("bwrap") {
        b.bwrap = Bwrap::probe();
    }
    if !b.skipped("runc") {
        b.runc = Oci::probe("runc", b._work.path());
    }
    if !b.skipped("runsc") {
        b.runsc = Oci::probe("runsc", b._work.path());
    }
    let outcome = measure(&mut b, which).await;
    // Sandboxes outlive their daemon: whatever this run created goes, also on errors.
    let label = [(LABEL.to_string(), "1".to_string())].into_iter().collect();
    for c in std::iter::once(&b.client).chain(b.pool.as_ref().ok()) {
        if let Ok(list) = c.list(&label, None).await {
            for sb in list.sandboxes {
                let _ = c.delete(&sb.id, true).await;
            }
        }
    }
    outcome?;
    let rows = std::mem::take(&mut b.rows);
    drop(b);
    let command = std::iter::once("./target/release/threadbox-bench".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    let doc = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "iterations": iters,
        "smoke": opts.smoke,
        "machine": machine(),
        "goals": goals(&rows),
        "results": rows,
    });
    if let Some(p) = &opts.markdown {
        // Hand-written notes (from a "## Notes" heading on) survive a regeneration.
        let notes = std::fs::read_to_string(p)
            .ok()
            .and_then(|old| old.find("\n## Notes").map(|i| old[i..].to_string()))
            .unwrap_or_default();
        std::fs::write(p, markdown_report(&doc, &rows, &command) + &notes)
            .with_context(|| format!("write {}", p.display()))?;
    }
    if opts.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", stats::table(&rows));
        println!();
        for g in doc["goals"].as_array().into_iter().flatten() {
            println!(
                "goal: {:<52} target {:<8} measured {:<10} {}",
                g["goal"].as_str().unwrap_or(""),
                g["target"].as_str().unwrap_or(""),
                g["measured"].as_str().unwrap_or("-"),
                match g["met"].as_bool() {
                    Some(true) => "met",
                    Some(false) => "NOT met",
                    None => "-",
                }
            );
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Setup => baselines::setup(),
        Cmd::All(o) => run(o, Which::All).await,
        Cmd::Figures(o) => run(o, Which::Figures).await,
        Cmd::Interpreter(o) => run(o, Which::Interpreter).await,
        Cmd::Egress(o) => egress::run(o).await,
        Cmd::Tracing(o) => tracing::run(o).await,
        Cmd::Tiers(o) => tiers::run(o).await,
        Cmd::Hibernate(o) => hibernate::run(o).await,
        Cmd::Density(o) => density::run(o).await,
        Cmd::Fork(o) => fork::run(o).await,
        Cmd::Layers(o) => layers::run(o).await,
        Cmd::EgressUpstream { addr } => egress::upstream(&addr),
    }
}
