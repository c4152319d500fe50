//! Density (issue 16 scope 6, ADR 0151): what a sandbox costs the host while it runs, is
//! paused and is hibernated, per tier, all in one run on one daemon. N sandboxes per tier
//! each hold `--hold` MiB of random bytes in a background process (so hibernate has
//! something to move and compression cannot hide it); then every sandbox is paused, then
//! hibernated, and after each step the bench reads:
//! - the memory charged to the sandboxes' cgroups (exact; 0 for a cgroup that is gone);
//! - the drop of the host's MemAvailable since before the creates (everything the host
//!   spends, daemon included; noisy on a shared machine);
//! - swap used (the jail hibernates to swap) and the bytes the sandboxes' directories
//!   occupy on disk (disk image, gVisor's checkpoint image);
//!   and, once hibernated, the first call's latency (the wake) per sandbox.
//!
//! The jail needs swap to hibernate: where the host has none, the bench makes a swap file
//! big enough (`/var/tmp`), and removes it at the end, also on failure. A tier that is
//! unavailable, or lacks the `hibernate` capability, is reported with the reason.

use super::*;
use std::path::Path;

#[derive(Args, Clone)]
pub struct DensityOpts {
    /// Sandboxes per tier.
    #[arg(long, default_value_t = 20)]
    count: usize,
    /// MiB of random bytes each sandbox's background process holds.
    #[arg(long, default_value_t = 32)]
    hold: u64,
    /// Tiers to measure.
    #[arg(long, value_delimiter = ',', default_value = "jail,gvisor")]
    tiers: Vec<String>,
    /// Three sandboxes per tier, 8 MiB each: checks the program completes.
    #[arg(long)]
    smoke: bool,
    /// Print the results as one JSON document instead of the table.
    #[arg(long)]
    json: bool,
}

const HOLDER: &str = "import os, time\nb = bytearray(os.urandom(int(os.environ['HOLD']) << 20))\nopen('/tmp/held', 'w').close()\nwhile True:\n    time.sleep(3600)\n";

/// A swap file, on until dropped.
struct SwapFile {
    file: PathBuf,
    _dir: tempfile::TempDir,
}

impl SwapFile {
    fn on(mib: u64) -> Result<SwapFile> {
        let dir = tempfile::Builder::new()
            .prefix("tb-bench-swap-")
            .tempdir_in("/var/tmp")?;
        let file = dir.path().join("swap");
        let run = |cmd: &mut Command| -> Result<()> {
            let out = cmd.output()?;
            if !out.status.success() {
                bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
            Ok(())
        };
        run(Command::new("fallocate")
            .args(["-l", &format!("{mib}M")])
            .arg(&file))?;
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        run(Command::new("mkswap").arg("-q").arg(&file))?;
        run(Command::new("swapon").arg(&file))?;
        Ok(SwapFile { file, _dir: dir })
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(&self.file).status();
    }
}

fn meminfo(key: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

fn swap_used() -> u64 {
    meminfo("SwapTotal:").saturating_sub(meminfo("SwapFree:"))
}

/// Bytes charged to the sandbox's memory cgroup; 0 when it has none now (a hibernated
/// gvisor sandbox has no processes, its cgroup may be gone).
fn charged(id: &str) -> u64 {
    for p in [
        format!("/sys/fs/cgroup/memory/threadbox/{id}/memory.usage_in_bytes"),
        format!("/sys/fs/cgroup/threadbox/{id}/memory.current"),
        format!("/sys/fs/cgroup/unified/threadbox/{id}/memory.current"),
    ] {
        if let Some(v) = std::fs::read_to_string(&p)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return v;
        }
    }
    0
}

/// Bytes allocated on disk under `dir` (sparse files count what they hold).
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.is_dir() {
                // A mounted disk's contents are in its image already.
                if m.dev() == std::fs::metadata(dir).map(|x| x.dev()).unwrap_or(0) {
                    stack.push(e.path());
                }
            } else {
                total += m.blocks() * 512;
            }
        }
    }
    total
}

/// One reading of the tier's N sandboxes.
struct Reading {
    charged: u64,
    host: f64,
    swap: f64,
    disk: u64,
}

fn read(ids: &[String], root: &Path, host_before: u64, swap_before: u64) -> Result<Reading> {
    Ok(Reading {
        charged: ids.iter().map(|id| charged(id)).sum(),
        host: baselines::host_used()? as f64 - host_before as f64,
        swap: swap_used() as f64 - swap_before as f64,
        disk: ids
            .iter()
            .map(|id| disk_bytes(&root.join("sandboxes").join(id)))
            .sum(),
    })
}

pub async fn run(mut o: DensityOpts) -> Result<()> {
    if o.smoke {
        o.count = o.count.min(3);
        o.hold = o.hold.min(8);
    }
    let (_daemon, url) = start_daemon(0).await?;
    let root = PathBuf::from(
        url.strip_prefix("unix://")
            .and_then(|p| p.strip_suffix("/threadbox.sock"))
            .context("the bench daemon's root")?,
    );
    let c = Client::new(&url)?;
    let list = c.call(&threadbox_api::tiers::ListTiers).await?;
    // The jail hibernates to swap: enough for every holder, and some for the rest.
    let _swap = if o.tiers.iter().any(|t| t == "jail") && meminfo("SwapTotal:") == 0 {
        Some(SwapFile::on(o.count as u64 * (o.hold + 16) + 512)?)
    } else {
        None
    };
    let mib = |b: f64| b / (1024.0 * 1024.0);
    let n = o.count;
    let mut rows = Vec::new();
    for tier in &o.tiers {
        let contender = format!("threadbox {tier}");
        let t = list.tiers.iter().find(|x| &x.name == tier);
        let why = match t {
            None => Some(format!("the daemon has no tier {tier}")),
            Some(x) if !x.available => Some(format!(
                "unavailable: {}",
                x.reason.as_deref().unwrap_or("?")
            )),
            _ => None,
        };
        if let Some(why) = why {
            rows.push(Row::skipped(
                "memory per sandbox, running",
                &contender,
                "MiB",
                &why,
            ));
            continue;
        }
        let can_hibernate = t.is_some_and(|x| x.capabilities.iter().any(|c| c == "hibernate"));
        settle().await;
        let (host0, swap0) = (baselines::host_used()?, swap_used());
        let mut ids = Vec::new();
        for _ in 0..n {
            let mut req = bench_sandbox();
            req.tier = Some(tier.clone());
            req.limits.memory_bytes = Some((o.hold + 96) << 20);
            let id = c.create(&req).await?.0.id;
            let mut env = std::collections::BTreeMap::new();
            env.insert("HOLD".to_string(), o.hold.to_string());
            c.start_process(
                &id,
                &StartProcessRequest {
                    command: Some(vec!["python3".into(), "-c".into(), HOLDER.into()]),
                    env,
                    ..Default::default()
                },
            )
            .await?;
            ids.push(id);
        }
        for id in &ids {
            let deadline = Instant::now() + Duration::from_secs(120);
            while c
                .exec(id, &exec_req(&["test", "-f", "/tmp/held"]))
                .await?
                .exit_code
                != Some(0)
            {
                if Instant::now() > deadline {
                    bail!("the holder of {id} did not start");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let mut states = Vec::new();
        settle().await;
        states.push(("running", read(&ids, &root, host0, swap0)?));
        for id in &ids {
            c.pause(id).await?;
        }
        settle().await;
        states.push(("paused", read(&ids, &root, host0, swap0)?));
        let mut wake = Vec::new();
        let mut hibernate_ms = Vec::new();
        let mut refused = None;
        if can_hibernate {
            for id in &ids {
                let t = Instant::now();
                if let Err(e) = c.hibernate(id).await {
                    refused = Some(format!("{e}"));
                    break;
                }
                hibernate_ms.push(ms(t.elapsed()));
            }
            if refused.is_none() {
                settle().await;
                states.push(("hibernated", read(&ids, &root, host0, swap0)?));
                for id in &ids {
                    wake.push(tb_exec(&c, id, &["true"]).await?);
                }
            }
        } else {
            refused = Some(format!("tier {tier} has no \"hibernate\" capability"));
        }
        for id in &ids {
            let _ = c.delete(id, true).await;
        }
        for (state, r) in &states {
            let per = |v: f64| v / n as f64;
            rows.push(Row::value(
                &format!("memory charged per sandbox, {state}"),
                &contender,
                "MiB",
                mib(per(r.charged as f64)),
                n,
            ));
            rows.push(Row::value(
                &format!("host MemAvailable Δ per sandbox, {state}"),
                &contender,
                "MiB",
                mib(per(r.host)),
                n,
            ));
            rows.push(Row::value(
                &format!("swap used per sandbox, {state}"),
                &contender,
                "MiB",
                mib(per(r.swap)),
                n,
            ));
            rows.push(Row::value(
                &format!("disk per sandbox, {state}"),
                &contender,
                "MiB",
                mib(per(r.disk as f64)),
                n,
            ));
        }
        match refused {
            Some(why) => rows.push(Row::skipped(
                "memory charged per sandbox, hibernated",
                &contender,
                "MiB",
                &why,
            )),
            None => {
                rows.push(Row::from_samples(
                    "hibernate (one call)",
                    &contender,
                    "ms",
                    hibernate_ms,
                ));
                rows.push(Row::from_samples(
                    "first call after hibernate (the wake)",
                    &contender,
                    "ms",
                    wake,
                ));
            }
        }
    }
    // Hibernated against paused, per tier: the RAM hibernate gives back.
    let by = |fig: &str, who: &str| {
        rows.iter()
            .find(|r| r.figure == fig && r.contender == who && r.skipped.is_none())
            .cloned()
    };
    let mut compared = Vec::new();
    for r in &rows {
        let base = if r.figure.ends_with(", hibernated") || r.figure.ends_with(", paused") {
            let stem = r.figure.rsplit_once(", ").map(|x| x.0).unwrap_or_default();
            by(&format!("{stem}, running"), &r.contender)
        } else {
            None
        };
        compared.push(match base {
            Some(b) if r.skipped.is_none() => r.clone().against(&b),
            _ => r.clone(),
        });
    }
    if o.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "machine": machine(),
                "count": n,
                "hold_mib": o.hold,
                "results": compared,
            }))?
        );
    } else {
        print!("{}", stats::table(&compared));
    }
    Ok(())
}
