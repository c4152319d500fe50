//! Fork of 3 with memory (issue 16 scope 4, ADR 0136; this figure ADR 0210): per trial a
//! new parent with a background counter, then `fork` of 3 copies, on the gvisor tier with
//! memory and on the jail (disk only, the jail refuses memory) as the baseline, interleaved
//! trial by trial in one run on one daemon. Timed: the fork call until it returns, and
//! from the call until every copy has answered an exec. Then every copy is checked: on
//! gvisor it has the parent's counter, the same process (pid) with the same in-memory
//! token, still counting; on the jail the parent's disk. A copy that fails the check, a
//! fork that errs or a parent that no longer answers is a failed trial: counted, shown
//! with its reason, never a figure. The parent's stall (its save, from the checkpoint to
//! its agent listening again) is read from the daemon's log, so only with a daemon the
//! bench starts itself.

use super::*;
use std::path::Path;
use threadbox_api::checkpoints::{Fork, ForkRequest};

#[derive(Args, Clone)]
pub struct ForkOpts {
    /// Trials per tier (each: a new parent, one fork of 3, the copies checked, all removed).
    #[arg(long, default_value_t = 10)]
    trials: usize,
    /// Two trials per tier: checks the program completes.
    #[arg(long)]
    smoke: bool,
    /// Print the results as one JSON document instead of the table.
    #[arg(long)]
    json: bool,
    /// A daemon to measure; without it one is started on a temporary root. With it the
    /// parent's stall is not reported (it is read from the log of a daemon the bench runs).
    #[arg(long)]
    url: Option<String>,
}

const COPIES: u32 = 3;

/// The parent's background process. It draws a token once, keeps it in its memory only,
/// and writes `TOKEN N` (N counting up) to /tmp/count, by rename so a reader never sees a
/// half-written file; its pid goes to /tmp/counter.pid. A copy that has the parent's memory
/// runs that very process: same pid, same token, N going on from the parent's. A restarted
/// process would draw another token, a lost one would stop counting.
const COUNTER: &str =
    "tok=$(od -An -N8 -tx8 /dev/urandom | tr -d ' '); echo $$ > /tmp/counter.pid; \
     i=0; while true; do i=$((i+1)); echo \"$tok $i\" > /tmp/count.new; \
     mv /tmp/count.new /tmp/count; sleep 0.05; done";

/// How long a sandbox may take to do what the checks wait for (the counter's first line,
/// the next count): generous, a debug build on a loaded machine is slow, and the wait ends
/// as soon as the condition holds.
const PATIENCE: Duration = Duration::from_secs(60);

/// One tier's series.
struct Tier {
    name: &'static str,
    contender: &'static str,
    with_memory: bool,
    absent: Option<String>,
    call: Vec<f64>,
    ready: Vec<f64>,
    /// The parent's save per gvisor trial: total and phases (checkpoint, halt, clone,
    /// restore, listen), ms, as the daemon logged them.
    stall: Vec<[f64; 6]>,
    stall_missing: usize,
    failed: Vec<String>,
}

impl Tier {
    fn new(name: &'static str, contender: &'static str, with_memory: bool) -> Tier {
        Tier {
            name,
            contender,
            with_memory,
            absent: None,
            call: Vec::new(),
            ready: Vec::new(),
            stall: Vec::new(),
            stall_missing: 0,
            failed: Vec::new(),
        }
    }
}

/// The counter's state in a sandbox: (pid, token, count), or why it cannot be read.
async fn counter(c: &Client, id: &str) -> Result<(String, String, u64)> {
    let r = c
        .exec(
            id,
            &exec_req(&["sh", "-c", "cat /tmp/counter.pid && cat /tmp/count"]),
        )
        .await?;
    if r.exit_code != Some(0) {
        bail!("no counter state in {id}: {}", r.stderr.trim());
    }
    let mut lines = r.stdout.lines();
    let pid = lines.next().unwrap_or_default().trim().to_string();
    let mut last = lines.next().unwrap_or_default().split_whitespace();
    let (tok, n) = (last.next(), last.next().and_then(|n| n.parse::<u64>().ok()));
    match (pid.is_empty(), tok, n) {
        (false, Some(tok), Some(n)) => Ok((pid, tok.to_string(), n)),
        _ => bail!("unreadable counter state in {id}: {:?}", r.stdout),
    }
}

/// The counter's state once it has counted past `above`; errs after [`PATIENCE`].
async fn counted_past(c: &Client, id: &str, above: u64) -> Result<(String, String, u64)> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let last = counter(c, id).await;
        match &last {
            Ok((_, _, n)) if *n > above => return last,
            _ if Instant::now() > deadline => {
                return match last {
                    Ok((_, _, n)) => Err(anyhow::anyhow!("{id}: the counter stopped at {n}")),
                    Err(e) => Err(e),
                }
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A new parent on `tier`, its counter running and its token on its disk (~/fork-bench):
/// (id, counter pid, token).
async fn parent(c: &Client, tier: &str) -> Result<(String, String, String)> {
    let mut req = bench_sandbox();
    req.tier = Some(tier.to_string());
    let id = c.create(&req).await?.0.id;
    c.start_process(
        &id,
        &StartProcessRequest {
            shell: Some(COUNTER.into()),
            ..Default::default()
        },
    )
    .await?;
    let (pid, tok, _) = counted_past(c, &id, 0).await?;
    // The token is od's hex output; checked, since it goes into a shell command.
    if !tok.chars().all(|ch| ch.is_ascii_hexdigit()) {
        bail!("unexpected counter token {tok:?} in {id}");
    }
    tb_exec(c, &id, &["sh", "-c", &format!("echo {tok} > ~/fork-bench")]).await?;
    Ok((id, pid, tok))
}

/// What the daemon logged of the parent's save after byte `from` of `log`: total and
/// phases in ms (`memory image written; the sandbox runs on … checkpoint_ms=… halt_ms=…
/// clone_ms=… restore_ms=… listen_ms=…`, crates/threadbox-jail/src/gvisor_fork.rs).
fn logged_stall(log: &Path, from: u64, parent: &str) -> Option<[f64; 6]> {
    let text = std::fs::read(log).ok()?;
    let text = String::from_utf8_lossy(text.get(from as usize..)?);
    let line = text.lines().find(|l| {
        l.contains("memory image written; the sandbox runs on")
            && l.contains(&format!(" sandbox={parent} "))
    })?;
    let field = |k: &str| -> Option<f64> {
        let v = line.split(&format!(" {k}=")).nth(1)?;
        v.split(|ch: char| !ch.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let phases = [
        field("checkpoint_ms")?,
        field("halt_ms")?,
        field("clone_ms")?,
        field("restore_ms")?,
        field("listen_ms")?,
    ];
    let total = phases.iter().sum();
    Some([total, phases[0], phases[1], phases[2], phases[3], phases[4]])
}

/// Removes every sandbox the bench made (they carry its label): after each trial, and
/// after a failed run.
async fn sweep(c: &Client) {
    let mut sel = std::collections::BTreeMap::new();
    sel.insert(LABEL.to_string(), "1".to_string());
    if let Ok(list) = c.list(&sel, None).await {
        for sb in list.sandboxes {
            let _ = c.delete(&sb.id, true).await;
        }
    }
}

/// The timed part of one trial and the checks: (call ms, all-answered ms). An error here
/// is a failed trial. `log` is the daemon's log when the bench runs it.
async fn fork_and_check(
    c: &Client,
    t: &mut Tier,
    parent: &str,
    pid: &str,
    tok: &str,
    log: Option<&Path>,
) -> Result<(f64, f64)> {
    let (_, _, before) = counter(c, parent).await?;
    let log_from = log.and_then(|p| std::fs::metadata(p).ok()).map(|m| m.len());
    let op = Fork {
        sandbox: parent.to_string(),
        request: ForkRequest {
            count: Some(COPIES),
            with_memory: Some(t.with_memory),
            ..Default::default()
        },
    };
    let start = Instant::now();
    let out = c.call(&op).await.context("the fork")?;
    let call = ms(start.elapsed());
    // Every copy asked at once: the figure is when the last one answers.
    let asks: Vec<_> = out
        .sandboxes
        .iter()
        .map(|sb| {
            let (c, id) = (c.clone(), sb.id.clone());
            tokio::spawn(async move { tb_exec(&c, &id, &["true"]).await.map(|_| id) })
        })
        .collect();
    for a in asks {
        a.await
            .context("an exec task")?
            .context("a copy did not answer")?;
    }
    let ready = ms(start.elapsed());
    if out.sandboxes.len() != COPIES as usize {
        bail!("asked for {COPIES} copies, got {}", out.sandboxes.len());
    }
    if out.with_memory != t.with_memory {
        bail!("the fork answered with_memory={}", out.with_memory);
    }
    for sb in &out.sandboxes {
        let id = &sb.id;
        if t.with_memory {
            let (p, k, n) = counter(c, id)
                .await
                .with_context(|| format!("copy {id} lost the parent's counter"))?;
            if p != pid || k != tok || n < before {
                bail!(
                    "copy {id} lost the parent's memory: counter pid {p} token {k} at {n}, \
                     the parent's pid {pid} token {tok} at {before} or more"
                );
            }
            let alive = c.exec(id, &exec_req(&["kill", "-0", pid])).await?.exit_code;
            if alive != Some(0) {
                bail!("copy {id}: the parent's counter (pid {pid}) does not run in it");
            }
            counted_past(c, id, n)
                .await
                .with_context(|| format!("copy {id}: the parent's counter does not run on"))?;
        }
        let r = c
            .exec(id, &exec_req(&["sh", "-c", "cat ~/fork-bench"]))
            .await?;
        if r.stdout.trim() != tok {
            bail!(
                "copy {id} lacks the parent's disk: ~/fork-bench is {:?}",
                r.stdout
            );
        }
    }
    tb_exec(c, parent, &["true"])
        .await
        .context("the parent did not answer after the fork")?;
    if let (Some(log), Some(from)) = (log, log_from) {
        match logged_stall(log, from, parent) {
            Some(s) => t.stall.push(s),
            None if t.with_memory => t.stall_missing += 1,
            None => {}
        }
    }
    Ok((call, ready))
}

async fn trial(c: &Client, t: &mut Tier, log: Option<&Path>) -> Result<()> {
    let (id, pid, tok) = parent(c, t.name)
        .await
        .with_context(|| format!("setting up a parent on {}", t.name))?;
    match fork_and_check(c, t, &id, &pid, &tok, log).await {
        Ok((call, ready)) => {
            t.call.push(call);
            t.ready.push(ready);
        }
        Err(e) => {
            eprintln!("threadbox-bench: failed trial on {}: {e:#}", t.name);
            t.failed.push(format!("{e:#}"));
        }
    }
    sweep(c).await;
    Ok(())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

pub async fn run(mut o: ForkOpts) -> Result<()> {
    if o.smoke {
        o.trials = o.trials.min(2);
    }
    let logdir = tempfile::Builder::new()
        .prefix("tb-bench-fork-")
        .tempdir()?;
    let log = logdir.path().join("daemon.log");
    let (_daemon, url, log) = match o.url.clone() {
        Some(u) => (None, u, None),
        None => {
            let (d, u) = start_daemon_io(0, &[], Some(&log)).await?;
            (Some(d), u, Some(log))
        }
    };
    let c = Client::new(&url)?;
    let r = measure(&o, &c, log.as_deref()).await;
    if r.is_err() {
        // A failed run leaves nothing behind: every sandbox it made carries the label.
        sweep(&c).await;
    }
    r
}

async fn measure(o: &ForkOpts, c: &Client, log: Option<&Path>) -> Result<()> {
    let list = c.call(&threadbox_api::tiers::ListTiers).await?;
    let mut tiers = [
        Tier::new("jail", "threadbox jail (disk only)", false),
        Tier::new("gvisor", "threadbox gvisor (with memory)", true),
    ];
    for t in &mut tiers {
        // A disk fork is part of `checkpoints` (disk checkpoints, rewind, fork).
        let need = if t.with_memory {
            "fork_memory"
        } else {
            "checkpoints"
        };
        t.absent = match list.tiers.iter().find(|x| x.name == t.name) {
            None => Some(format!("the daemon has no tier {}", t.name)),
            Some(x) if !x.available => Some(format!(
                "unavailable: {}",
                x.reason.as_deref().unwrap_or("no reason given")
            )),
            Some(x) if !x.capabilities.iter().any(|c| c == need) => {
                Some(format!("tier {} has no {need:?} capability", t.name))
            }
            _ => None,
        };
        if let Some(why) = &t.absent {
            eprintln!("threadbox-bench: tier {} left out: {why}", t.name);
        }
    }
    // runsc is found by the daemon (THREADBOX_RUNSC), not always on PATH as machine() reads it.
    let runsc = list
        .tiers
        .iter()
        .find(|x| x.name == "gvisor")
        .and_then(|x| x.version.clone());
    let load_before = loadavg();
    for i in 0..o.trials {
        eprintln!("threadbox-bench: fork trial {}/{}", i + 1, o.trials);
        for k in rotation(i, tiers.len()) {
            let t = &mut tiers[k];
            if t.absent.is_none() {
                trial(c, t, log).await?;
            }
        }
    }
    let load_after = loadavg();
    let rows = rows(tiers, o.trials, log.is_some());
    if o.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "machine": machine(),
                "trials": o.trials,
                "copies": COPIES,
                "gvisor_runsc": runsc,
                "load_average": {"before": load_before, "after": load_after},
                "results": rows,
            }))?
        );
    } else {
        print!("{}", stats::table(&rows));
        println!("\nload average (1, 5, 15 min): before {load_before}, after {load_after}");
    }
    Ok(())
}

const CALL: &str = "fork of 3: the call returns";
const READY: &str = "fork of 3: until all 3 answer an exec";
const STALL: &str = "fork of 3: parent's save, checkpoint→listening";
const FAILED: &str = "fork of 3: failed trials";

fn rows(tiers: [Tier; 2], trials: usize, own_daemon: bool) -> Vec<Row> {
    let [jail, gvisor] = tiers;
    // A series: its samples, or why there are none.
    let series = |t: &Tier, fig: &str, samples: &[f64]| -> Row {
        match (&t.absent, t.failed.first()) {
            (Some(why), _) => Row::skipped(fig, t.contender, "ms", why),
            (None, Some(first)) if samples.is_empty() => Row::skipped(
                fig,
                t.contender,
                "ms",
                &format!("every trial failed; first: {first}"),
            ),
            _ => Row::from_samples(fig, t.contender, "ms", samples.to_vec()),
        }
    };
    let mut rows = Vec::new();
    for (fig, pick) in [
        (CALL, (|t: &Tier| t.call.clone()) as fn(&Tier) -> Vec<f64>),
        (READY, |t: &Tier| t.ready.clone()),
    ] {
        let base = series(&jail, fig, &pick(&jail));
        rows.push(series(&gvisor, fig, &pick(&gvisor)).against(&base));
        rows.push(base);
    }
    let stall = match (&gvisor.absent, own_daemon, gvisor.stall.is_empty()) {
        (Some(why), _, _) => Row::skipped(STALL, gvisor.contender, "ms", why),
        (None, false, _) => Row::skipped(
            STALL,
            gvisor.contender,
            "ms",
            "read from the log of a daemon the bench starts (not with --url)",
        ),
        (None, true, true) => Row::skipped(
            STALL,
            gvisor.contender,
            "ms",
            "no successful trial logged the parent's save",
        ),
        (None, true, false) => {
            let col = |i: usize| -> f64 {
                let mut v: Vec<f64> = gvisor.stall.iter().map(|s| s[i]).collect();
                v.sort_by(|a, b| a.total_cmp(b));
                stats::percentile(&v, 0.5)
            };
            let mut r = Row::from_samples(
                STALL,
                gvisor.contender,
                "ms",
                gvisor.stall.iter().map(|s| s[0]).collect(),
            );
            let mut note = format!(
                "p50 phases: checkpoint {:.0}, halt {:.0}, clone {:.0}, restore {:.0}, \
                 listen {:.0} ms",
                col(1),
                col(2),
                col(3),
                col(4),
                col(5)
            );
            if gvisor.stall_missing > 0 {
                note.push_str(&format!(
                    "; {} trial(s) without the log line",
                    gvisor.stall_missing
                ));
            }
            r.note = Some(note);
            r
        }
    };
    rows.push(stall);
    for t in [&gvisor, &jail] {
        if let Some(why) = &t.absent {
            rows.push(Row::skipped(FAILED, t.contender, "count", why));
            continue;
        }
        let mut r = Row::value(FAILED, t.contender, "count", t.failed.len() as f64, trials);
        r.note = t.failed.first().cloned();
        rows.push(r);
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parents_save_is_read_from_its_log_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("d.log");
        std::fs::write(
            &log,
            "2026-12-02T14:00:00Z  INFO threadbox_jail::gvisor_fork: memory image written; \
             the sandbox runs on sandbox=other bytes=1 checkpoint_ms=1 halt_ms=1 clone_ms=1 \
             restore_ms=1 listen_ms=1\n\
             2026-12-02T14:00:01Z  INFO threadbox_jail::gvisor_fork: memory image written; \
             the sandbox runs on sandbox=sb1 bytes=4096 checkpoint_ms=120 halt_ms=3 \
             clone_ms=8 restore_ms=200 listen_ms=40\n",
        )
        .unwrap();
        assert_eq!(
            logged_stall(&log, 0, "sb1"),
            Some([371.0, 120.0, 3.0, 8.0, 200.0, 40.0])
        );
        assert_eq!(logged_stall(&log, 0, "sb2"), None);
        // Only what was logged after the offset counts.
        let len = std::fs::metadata(&log).unwrap().len();
        assert_eq!(logged_stall(&log, len, "sb1"), None);
    }
}
