//! Layer-store figures (issue 14, ADRs 0100, 0101, 0180), in one run: checkpoint of a
//! sandbox holding `--mb` MB of files (the API call, and the frozen instant the daemon
//! logs as `frozen_us`), fork of 3 to running sandboxes booted cold against staged slots
//! (`serve --staged-pool 3`), rewind to running, and `image pull` against `skopeo copy` of
//! the same image from the same local registry.
//!
//! What bench/layers/bench.py and pull_vs_skopeo.sh measured, in the shape of the other
//! subcommands (they remain as notes pointing here). The daemon's root is an xfs loop
//! image (reflink) unless `--ext4` (the host's file system; the daemon then mounts its own
//! xfs store image, ADR 0101, or copies with `--store-off`). The cold and staged forks
//! alternate daemons restarted on the same root, the parent running throughout; a staged
//! fork waits for the pool to be full again (counted from the daemon's own log). The pull's
//! image is one gzip layer made by umoci of `--rootfs`, pushed to Debian's
//! `docker-registry` on loopback; the pull daemon has its own temporary root with the store
//! image off, as the script's. A tool that is missing makes its rows skipped, with why.

use super::*;
use std::path::Path;

#[derive(Args, Clone)]
pub struct LayersOpts {
    /// Checkpoints and rewinds measured; forks and pulls take as many per contender
    /// (forks rounded up to two rounds of cold and staged).
    #[arg(long, default_value_t = 5)]
    trials: usize,
    /// MB of files in the parent sandbox (written as 1 MB files of /dev/urandom).
    #[arg(long, default_value_t = 200)]
    mb: usize,
    /// Tiny sizes (4 MB parent, a 4 MB image), one trial: checks the program completes.
    #[arg(long)]
    smoke: bool,
    /// Print the results as one JSON document instead of the table.
    #[arg(long)]
    json: bool,
    /// Daemon to measure instead of starting one. Its log is not ours, so the frozen
    /// instant and the staged forks (which wait on the log) are reported skipped.
    #[arg(long)]
    url: Option<String>,
    /// The daemon's root on the host's file system instead of an xfs loop image.
    #[arg(long)]
    ext4: bool,
    /// With --ext4: `serve --store-image off` (clones are sparse copies, ADR 0101).
    #[arg(long)]
    store_off: bool,
    /// Slots of the staged daemon (`serve --staged-pool N`).
    #[arg(long, default_value_t = 3)]
    staged_pool: usize,
    /// The pulled image's content: a root file system directory (default
    /// THREADBOX_TEST_ROOTFS, else target/test-rootfs/debian). --smoke makes a small one.
    #[arg(long)]
    rootfs: Option<PathBuf>,
    /// Copy the daemons' logs into this directory.
    #[arg(long)]
    logs: Option<PathBuf>,
}

/// Forks per `fork` call, as the figure.
const FORKS: u32 = 3;
const CK: &str = "checkpoint (API call)";
const FROZEN: &str = "checkpoint: frozen instant (syncfs + clone)";
const FORK: &str = "fork of 3 to running sandboxes";
const REWIND: &str = "rewind to running";
const PULL: &str = "pull of the image, same local registry";
const PULL_RATE: &str = "pull throughput (compressed layer)";
const COLD: &str = "threadbox, cold boot";
const STAGED: &str = "threadbox, staged slots";
const SKOPEO: &str = "skopeo copy (fetch+verify)";
const TB_PULL: &str = "threadbox image pull (fetch+verify+unpack)";

/// A `threadbox serve` of this run whose stderr goes to its own log file.
struct Daemon {
    child: Child,
    log: PathBuf,
    /// Set once reaped: a second SIGTERM could reach a process that reused the pid.
    stopped: bool,
}

impl Daemon {
    /// Starts `serve` on `root` and waits (deadline 60 s) until it answers on its socket.
    async fn start(root: &Path, log: PathBuf, extra: &[String]) -> Result<(Daemon, String)> {
        let exe = std::env::current_exe()?;
        let dir = exe.parent().context("no exe dir")?;
        // `cargo test` runs the binary from target/<profile>/ too; deps/ is one level down.
        let bin: PathBuf = [dir.join("threadbox"), dir.join("../threadbox")]
            .into_iter()
            .find(|p| p.is_file())
            .context("no threadbox binary next to threadbox-bench: build the workspace")?;
        let sock = root.join("threadbox.sock");
        // A socket left by the previous daemon would answer nothing; the health check
        // below must only ever reach the new one.
        let _ = std::fs::remove_file(&sock);
        let file = std::fs::File::create(&log).with_context(|| format!("{}", log.display()))?;
        let mut cmd = Command::new(&bin);
        cmd.args(["serve", "--root"])
            .arg(root)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            // The log is parsed: info is where `frozen_us` and the staged pool's lines
            // are, whatever RUST_LOG the caller has; no colour codes inside the fields.
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::from(file));
        let mut d = Daemon {
            child: cmd.spawn()?,
            log,
            stopped: false,
        };
        let url = format!("unix://{}", sock.display());
        let client = Client::new(&url)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while client.health().await.is_err() {
            if !matches!(d.child.try_wait(), Ok(None)) || Instant::now() > deadline {
                bail!("the daemon did not come up: {}", tail(&d.log_text()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok((d, url))
    }

    fn log_text(&self) -> String {
        let raw = std::fs::read(&self.log).unwrap_or_default();
        strip_ansi(&String::from_utf8_lossy(&raw))
    }

    fn count(&self, what: &str) -> usize {
        self.log_text().lines().filter(|l| l.contains(what)).count()
    }

    /// Staged slots ready and not yet taken, by this daemon's log.
    fn staged_waiting(&self) -> usize {
        let text = self.log_text();
        let n = |s: &str| text.lines().filter(|l| l.contains(s)).count();
        n("staged pool: slot ready").saturating_sub(
            n("staged pool: slot taken") + n("staged pool: slot gone") + n("removed a pooled"),
        )
    }

    /// SIGTERM (the daemon destroys its staged slots) and waits for the exit; SIGKILL
    /// after 30 s.
    fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        terminate(&mut self.child, Duration::from_secs(30));
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

fn tail(s: &str) -> String {
    let start = s.len().saturating_sub(2000);
    // A char boundary at or after `start`.
    let start = (start..=s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(s.len());
    s[start..].to_string()
}

/// Removes ANSI escape sequences (`ESC [ … letter`), in case colours are on anyway.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\x1b' && it.peek() == Some(&'[') {
            for c in it.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `frozen_us` of the "disk cloned while frozen" lines of the checkpoints in `ids`, in ms
/// (the fork's internal clones log the same line; they are not checkpoints).
fn frozen_ms(log: &str, ids: &[String]) -> Vec<f64> {
    log.lines()
        .filter(|l| l.contains("disk cloned while frozen"))
        .filter_map(|l| {
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(k).map(str::to_string))
            };
            let ck = field("checkpoint=")?;
            let us: f64 = field("frozen_us=")?.parse().ok()?;
            ids.contains(&ck).then_some(us / 1000.0)
        })
        .collect()
}

/// The daemon's root: a directory, on an xfs loop image unless --ext4. Unmounted (and
/// the daemon's store image with it, ADR 0101) and removed on drop.
struct Root {
    work: tempfile::TempDir,
    mounted: bool,
}

impl Root {
    fn make(ext4: bool) -> Result<Root> {
        let work = tempfile::Builder::new()
            .prefix("tb-bench-layers-")
            .tempdir()?;
        let root = work.path().join("root");
        std::fs::create_dir(&root)?;
        let mut r = Root {
            work,
            mounted: false,
        };
        if !ext4 {
            // Sparse: only what is written takes space; large enough for any --mb.
            let img = r.work.path().join("store.img");
            std::fs::File::create(&img)?.set_len(64 << 30)?;
            run_ok(
                Command::new("mkfs.xfs")
                    .args(["-q", "-m", "reflink=1"])
                    .arg(&img),
                "mkfs.xfs (xfsprogs; or --ext4)",
            )?;
            run_ok(
                Command::new("mount")
                    .args(["-o", "loop"])
                    .arg(&img)
                    .arg(&root),
                "mount the xfs loop image",
            )?;
            r.mounted = true;
        }
        Ok(r)
    }
    fn path(&self) -> PathBuf {
        self.work.path().join("root")
    }
    fn log(&self, name: &str) -> PathBuf {
        self.work.path().join(name)
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.path().join("sandboxes"))
            .stderr(Stdio::null())
            .status();
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        }
    }
}

fn run_ok(c: &mut Command, what: &str) -> Result<()> {
    let out = c.output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

fn shell_req(sh: &str) -> ExecRequest {
    ExecRequest {
        shell: Some(sh.into()),
        // Writing the parent's files from /dev/urandom takes seconds on a loaded machine.
        timeout_secs: Some(600.0),
        ..Default::default()
    }
}

async fn sh_in(c: &Client, id: &str, sh: &str) -> Result<()> {
    let r = c.exec(id, &shell_req(sh)).await?;
    if r.exit_code != Some(0) {
        bail!("{sh:?} failed in the sandbox: {}", r.stderr);
    }
    Ok(())
}

async fn fork3(c: &Client, parent: &str) -> Result<f64> {
    let t = Instant::now();
    let out = c
        .call(&threadbox_api::checkpoints::Fork {
            sandbox: parent.into(),
            request: threadbox_api::checkpoints::ForkRequest {
                count: Some(FORKS),
                ..Default::default()
            },
        })
        .await?;
    let el = ms(t.elapsed());
    let n = out.sandboxes.len();
    let running = out
        .sandboxes
        .iter()
        .all(|s| s.state == threadbox_api::SandboxState::Running);
    for s in &out.sandboxes {
        c.delete(&s.id, true).await?;
    }
    if n != FORKS as usize || !running {
        bail!("the fork answered {n} sandboxes, running: {running}");
    }
    Ok(el)
}

/// Waits until the staged daemon has `n` slots ready (deadline 180 s: a slot boots part of
/// a sandbox, several seconds on a loaded machine).
async fn wait_staged_full(d: &Daemon, n: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(180);
    while d.staged_waiting() < n {
        if Instant::now() > deadline {
            bail!(
                "the staged pool did not fill ({} of {n} slots)",
                d.staged_waiting()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

struct Out {
    rows: Vec<Row>,
    notes: Vec<String>,
}

/// Checkpoint, frozen instant, rewind and fork (cold against staged).
async fn sandbox_figures(o: &LayersOpts, out: &mut Out) -> Result<()> {
    let root = match &o.url {
        Some(_) => None,
        None => Some(Root::make(o.ext4)?),
    };
    let mut extra = Vec::new();
    if o.ext4 {
        // Said explicitly, so THREADBOX_STORE_IMAGE in the caller's environment (the test
        // suite sets it off) does not decide which ext4 case is measured.
        extra = vec![
            "--store-image".to_string(),
            if o.store_off { "off" } else { "auto" }.to_string(),
        ];
    }
    let mut starts = 0;
    let mut daemon = None;
    let mut url = o.url.clone().unwrap_or_default();
    if let Some(r) = &root {
        starts += 1;
        let (d, u) = Daemon::start(&r.path(), r.log("daemon-1.log"), &extra).await?;
        daemon = Some(d);
        url = u;
    }
    let where_ = match (&o.url, o.ext4, o.store_off) {
        (Some(u), _, _) => format!("the daemon at {u}"),
        (None, false, _) => "root on an xfs loop image (reflink)".into(),
        (None, true, true) => "root on the host fs, store image off (sparse copies)".into(),
        (None, true, false) => "root on the host fs, the daemon's xfs store image".into(),
    };
    let mut c = Client::new(&url)?;
    let parent = c.create(&bench_sandbox()).await?.0.id;
    let result = async {
        sh_in(
            &c,
            &parent,
            &format!(
                "for i in $(seq {}); do head -c 1048576 /dev/urandom > ~/f$i; done; sync",
                o.mb
            ),
        )
        .await?;
        let ck = |label: &str| threadbox_api::checkpoints::CreateCheckpoint {
            sandbox: parent.clone(),
            request: threadbox_api::checkpoints::CreateCheckpointRequest {
                label: Some(label.into()),
                with_memory: false,
            },
        };
        let base = c.call(&ck("base")).await?;
        out.notes.push(format!(
            "{where_}; parent of {} MB of files; checkpoint method {}",
            o.mb, base.method
        ));
        let (mut cks, mut ids) = (Vec::new(), Vec::new());
        for i in 0..o.trials {
            sh_in(&c, &parent, &format!("echo {i} > ~/marker")).await?;
            let t = Instant::now();
            let made = c.call(&ck(&format!("t{i}"))).await?;
            cks.push(ms(t.elapsed()));
            ids.push(made.id);
        }
        let mut rewinds = Vec::new();
        for _ in 0..o.trials {
            let t = Instant::now();
            let sb = c
                .call(&threadbox_api::checkpoints::Rewind {
                    sandbox: parent.clone(),
                    request: threadbox_api::checkpoints::RewindRequest {
                        to: "base".into(),
                        drop_later: false,
                    },
                })
                .await?;
            rewinds.push(ms(t.elapsed()));
            if sb.state != threadbox_api::SandboxState::Running {
                bail!("the rewind left the parent {:?}", sb.state);
            }
        }
        out.rows
            .push(Row::from_samples(CK, "threadbox API", "ms", cks));
        out.rows.push(match &daemon {
            Some(d) => {
                let f = frozen_ms(&d.log_text(), &ids);
                if f.len() == ids.len() {
                    Row::from_samples(FROZEN, "threadbox (daemon's log)", "ms", f)
                } else {
                    Row::skipped(
                        FROZEN,
                        "threadbox (daemon's log)",
                        "ms",
                        &format!("{} of {} frozen_us lines in the log", f.len(), ids.len()),
                    )
                }
            }
            None => Row::skipped(
                FROZEN,
                "threadbox (daemon's log)",
                "ms",
                "--url: the daemon's log is not this run's",
            ),
        });
        out.rows
            .push(Row::from_samples(REWIND, "threadbox API", "ms", rewinds));

        // Cold and staged alternate, two rounds each, on daemons restarted on the same root:
        // what is compared is the boot, not the root or the parent.
        let per_round = o.trials.div_ceil(2).max(1);
        let (mut cold, mut staged) = (Vec::new(), Vec::new());
        let mut staged_skip: Option<String> = None;
        let mut attached = 0;
        for round in 0..2 {
            for mode_staged in [false, true] {
                if mode_staged && staged_skip.is_some() {
                    continue;
                }
                if let (Some(r), true) = (&root, round > 0 || mode_staged) {
                    if let Some(mut d) = daemon.take() {
                        d.stop();
                        if let Some(dir) = &o.logs {
                            copy_log(&d, dir);
                        }
                    }
                    starts += 1;
                    let mut args = extra.clone();
                    if mode_staged {
                        args.extend(["--staged-pool".to_string(), o.staged_pool.to_string()]);
                    }
                    let log = r.log(&format!("daemon-{starts}.log"));
                    let (d, u) = Daemon::start(&r.path(), log, &args).await?;
                    daemon = Some(d);
                    // A new client: a pooled connection would be to the daemon just stopped.
                    c = Client::new(&u)?;
                }
                if mode_staged && daemon.is_none() {
                    staged_skip =
                        Some("--url: needs a daemon this run restarts with --staged-pool".into());
                    continue;
                }
                for _ in 0..per_round {
                    if let (true, Some(d)) = (mode_staged, &daemon) {
                        wait_staged_full(d, o.staged_pool.min(FORKS as usize)).await?;
                    }
                    let v = fork3(&c, &parent).await?;
                    if mode_staged {
                        staged.push(v);
                    } else {
                        cold.push(v);
                    }
                }
                if let (true, Some(d)) = (mode_staged, &daemon) {
                    attached += d.count("staged slot attached");
                }
            }
        }
        let base = Row::from_samples(FORK, COLD, "ms", cold);
        let st = match staged_skip {
            Some(why) => Row::skipped(FORK, STAGED, "ms", &why),
            None => {
                let n = staged.len() * FORKS as usize;
                Row::from_samples(FORK, STAGED, "ms", staged)
                    .against(&base)
                    .note(format!("{attached} of {n} forks booted by an attach"))
            }
        };
        out.rows.push(st);
        out.rows.push(match &root {
            Some(_) => base.note("alternating daemons on one root, the parent running"),
            None => base,
        });
        anyhow::Ok(())
    }
    .await;
    // The parent (and any fork left by a failure) goes, also on errors.
    let _ = c.delete(&parent, true).await;
    let label = [(LABEL.to_string(), "1".to_string())].into_iter().collect();
    if let Ok(list) = c.list(&label, None).await {
        for sb in list.sandboxes {
            let _ = c.delete(&sb.id, true).await;
        }
    }
    if let (Some(mut d), Some(dir)) = (daemon.take(), &o.logs) {
        d.stop();
        copy_log(&d, dir);
    }
    drop(daemon);
    drop(root);
    result
}

fn copy_log(d: &Daemon, dir: &Path) {
    let _ = std::fs::create_dir_all(dir);
    if let Some(name) = d.log.file_name() {
        let _ = std::fs::copy(&d.log, dir.join(name));
    }
}

/// A `docker-registry serve` on loopback, killed on drop.
struct Registry(Child);

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A small tree of incompressible files for --smoke's image.
fn small_rootfs(dir: &Path, mb: usize) -> Result<()> {
    use std::io::Read;
    std::fs::create_dir_all(dir.join("etc"))?;
    std::fs::write(dir.join("etc/hostname"), "bench\n")?;
    let mut rnd = std::fs::File::open("/dev/urandom")?;
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..mb {
        rnd.read_exact(&mut buf)?;
        std::fs::write(dir.join(format!("f{i}")), &buf)?;
    }
    Ok(())
}

/// Pull against skopeo copy, interleaved; rows skipped with the reason when a tool or the
/// root file system is missing.
async fn pull_figures(o: &LayersOpts, out: &mut Out) -> Result<()> {
    let skip_all = |out: &mut Out, why: &str| {
        for (fig, unit) in [(PULL, "s"), (PULL_RATE, "MB/s")] {
            out.rows.push(Row::skipped(fig, TB_PULL, unit, why));
            out.rows.push(Row::skipped(fig, SKOPEO, unit, why));
        }
    };
    if let Some(t) = ["umoci", "skopeo", "docker-registry"]
        .into_iter()
        .find(|t| !on_path(t))
    {
        skip_all(out, &format!("{t} is not on PATH (apt-get install {t})"));
        return Ok(());
    }
    let w = tempfile::Builder::new()
        .prefix("tb-bench-pull-")
        .tempdir()?;
    let rootfs = if o.smoke && o.rootfs.is_none() {
        let d = w.path().join("rootfs");
        small_rootfs(&d, 4)?;
        d
    } else {
        o.rootfs
            .clone()
            .or_else(|| std::env::var_os("THREADBOX_TEST_ROOTFS").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("target/test-rootfs/debian"))
    };
    if !rootfs.is_dir() {
        skip_all(
            out,
            &format!("no root file system at {} (--rootfs)", rootfs.display()),
        );
        return Ok(());
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let storage = w.path().join("storage");
    std::fs::create_dir(&storage)?;
    let cfg = w.path().join("reg.yml");
    std::fs::write(
        &cfg,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            storage.display()
        ),
    )?;
    let _reg = Registry(
        Command::new("docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let layout = w.path().join("layout");
    let img = format!("{}:1", layout.display());
    run_ok(
        Command::new("umoci")
            .args(["init", "--layout"])
            .arg(&layout),
        "umoci init",
    )?;
    run_ok(
        Command::new("umoci").args(["new", "--image", &img]),
        "umoci new",
    )?;
    run_ok(
        Command::new("umoci")
            .args(["insert", "--image", &img])
            .arg(&rootfs)
            .arg("/"),
        "umoci insert",
    )?;
    // The gzip layer is the largest blob (umoci's configs and manifests are small).
    let layer_mb = std::fs::read_dir(layout.join("blobs/sha256"))?
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .max()
        .unwrap_or(0) as f64
        / 1e6;
    let reference = format!("127.0.0.1:{port}/bench/debian:1");
    // The push is also the wait for the registry to listen: retried until a deadline.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = Command::new("skopeo")
            .args([
                "copy",
                "--quiet",
                "--insecure-policy",
                "--dest-tls-verify=false",
            ])
            .arg(format!("oci:{img}"))
            .arg(format!("docker://{reference}"))
            .stderr(Stdio::null())
            .status()?;
        if st.success() {
            break;
        }
        if Instant::now() > deadline {
            bail!("skopeo could not push the image to the local registry");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (mut daemon, c) = match &o.url {
        Some(u) => (None, Client::new(u)?),
        None => {
            // Its own root with the store image off, as pull_vs_skopeo.sh: a pull writes
            // layers, never a sandbox disk, so the store image has no part in it.
            let root = w.path().join("root");
            std::fs::create_dir(&root)?;
            let (d, url) = Daemon::start(
                &root,
                w.path().join("pull-daemon.log"),
                &["--store-image".into(), "off".into()],
            )
            .await?;
            (Some(d), Client::new(&url)?)
        }
    };
    let (mut skopeo, mut ours) = (Vec::new(), Vec::new());
    for i in 0..o.trials {
        for k in rotation(i, 2) {
            if k == 0 {
                let dst = w.path().join(format!("out{i}"));
                let t = Instant::now();
                run_ok(
                    Command::new("skopeo")
                        .args([
                            "copy",
                            "--quiet",
                            "--insecure-policy",
                            "--src-tls-verify=false",
                        ])
                        .arg(format!("docker://{reference}"))
                        .arg(format!("dir:{}", dst.display())),
                    "skopeo copy",
                )?;
                skopeo.push(t.elapsed().as_secs_f64());
                std::fs::remove_dir_all(&dst)?;
            } else {
                let name = format!("tb-bench-pull-{i}");
                let t = Instant::now();
                c.pull_image(&threadbox_api::images::PullImageRequest {
                    reference: reference.clone(),
                    name: Some(name.clone()),
                    insecure: true,
                    ..Default::default()
                })
                .await?;
                ours.push(t.elapsed().as_secs_f64());
                // `image rm` also removes its layers and blobs: the next pull fetches all.
                c.remove_image(&name).await?;
            }
        }
    }
    if let (Some(d), Some(dir)) = (&mut daemon, &o.logs) {
        d.stop();
        copy_log(d, dir);
    }
    drop(daemon);
    let rate = |v: &[f64]| v.iter().map(|s| layer_mb / s).collect::<Vec<_>>();
    let note = format!("one gzip layer of {layer_mb:.1} MB, interleaved");
    let base = Row::from_samples(PULL, SKOPEO, "s", skopeo.clone()).note(note.clone());
    out.rows
        .push(Row::from_samples(PULL, TB_PULL, "s", ours.clone()).against(&base));
    out.rows.push(base);
    let base = Row::from_samples(PULL_RATE, SKOPEO, "MB/s", rate(&skopeo)).note(note);
    out.rows
        .push(Row::from_samples(PULL_RATE, TB_PULL, "MB/s", rate(&ours)).against(&base));
    out.rows.push(base);
    Ok(())
}

pub async fn run(mut o: LayersOpts) -> Result<()> {
    if o.smoke {
        o.trials = 1;
        o.mb = o.mb.min(4);
    }
    o.trials = o.trials.max(1);
    let load = || sh("cut -d' ' -f1-3 /proc/loadavg");
    let load_before = load();
    let mut out = Out {
        rows: Vec::new(),
        notes: Vec::new(),
    };
    eprintln!("threadbox-bench: checkpoint, rewind, fork cold against staged");
    sandbox_figures(&o, &mut out).await?;
    eprintln!("threadbox-bench: pull against skopeo copy");
    pull_figures(&o, &mut out).await?;
    let load_after = load();
    if o.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "machine": machine(),
                "trials": o.trials,
                "mb": o.mb,
                "smoke": o.smoke,
                "load_before": load_before,
                "load_after": load_after,
                "notes": out.notes,
                "results": out.rows,
            }))?
        );
    } else {
        for n in &out.notes {
            println!("{n}");
        }
        println!("load average before: {load_before}; after: {load_after}");
        print!("{}", stats::table(&out.rows));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_lines_of_the_given_checkpoints_only() {
        let log = "\x1b[2m2026\x1b[0m INFO threadbox_core: disk cloned while frozen sandbox=sb-1 checkpoint=ck-a frozen_us=1700\n\
                   INFO threadbox_core: disk cloned while frozen sandbox=sb-1 checkpoint=fork-x frozen_us=900\n\
                   INFO other line frozen_us=5\n";
        let got = frozen_ms(&strip_ansi(log), &["ck-a".to_string()]);
        assert_eq!(got, vec![1.7]);
    }
}
