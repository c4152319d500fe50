//! `threadbox-agent`: PID 1 inside a sandbox. It serves the host over threadbox-proto:
//! runs processes under the sandbox's child policy, keeps background processes, serves
//! files as the requesting user, reaps every zombie, and checks its own posture.
//!
//! Once set up, the agent filters its own system calls (`own_filter`).
//!
//! The process is single-threaded on purpose (a tokio current-thread runtime, no
//! `spawn_blocking`, no `tokio::fs`/`tokio::process`): forking stays safe, per-thread
//! filesystem ids (`setfsuid`) apply to the whole agent, and PID 1 alone reaps children.
#![forbid(unsafe_code)]

mod agent;
mod background;
mod conn;
mod error;
mod exec;
mod files;
mod interp;
mod oom;
mod own_filter;
mod pty;
mod selftest;
mod testhooks;

use std::os::fd::OwnedFd;

/// Freed event-loop registrations stay allocated for a while: gVisor delivers events
/// for some removed before a checkpoint after the restore (ADR 0199).
#[global_allocator]
static ALLOC: threadbox_sys::alloc::Quarantine = threadbox_sys::alloc::Quarantine::new();
use std::process::ExitCode;
use std::rc::Rc;
use threadbox_sys::child::{self as syschild, DirFd};
use threadbox_sys::resolve::{Resolve, Root};

const USAGE: &str = "usage: threadbox-agent (--listen-fd N | --listen unix:PATH) [--cgroup-fd M]

  --listen-fd N     serve connections on the listening unix socket inherited as fd N
  --listen unix:P   bind and listen on the unix socket P (host test mode)
  --cgroup-fd M     fd of the sandbox's delegated cgroup v2 directory; each exec and
                    background process gets its own child cgroup in it
  --allow-no-landlock  run even where Landlock cannot be enforced (the operator's
                    explicit choice of a weaker posture; refused otherwise)
  --tier NAME       the isolation tier the agent runs on (jail, the default, or gvisor):
                    which posture checks the selftest makes
  --sync            sync the file system of / and exit (the gvisor tier's checkpoints)
  --hostname NAME   set the hostname and exit (a gvisor fork restored from memory)
  --pids-max N      gvisor: bound the sandbox's processes in the sentry's own pids cgroup
                    (at start; with --set-pids-max N, set it and exit)
  --memory-max N    gvisor: kill the largest sandbox process past N bytes, as the
                    sentry has no OOM killer (with --set-memory-max N, set it and exit)
  --version         print the version";

#[derive(Debug, Default)]
struct Args {
    listen_fd: Option<i32>,
    listen_path: Option<String>,
    cgroup_fd: Option<i32>,
    allow_no_landlock: bool,
    tier: selftest::Tier,
    pids_max: Option<u64>,
    memory_max: Option<u64>,
}

/// The sandbox's own pids cgroup in gVisor's cgroupfs, which the gvisor tier mounts at
/// `/sys/fs/cgroup` and where runsc puts the container (the agent and all it starts).
const SENTRY_PIDS_MAX: &str = "/sys/fs/cgroup/pids/pids.max";
/// Where the calls' cgroups go (ADR 0214): gVisor's `job` hierarchy, a controller that only
/// holds an id. Not the pids hierarchy: gVisor 20240729 charges a task to its own pids
/// cgroup only, not to the ancestors, so a call moved to a child there would leave the
/// sandbox's `pids.max` behind (security case E1 saw the sentry die of it).
const SENTRY_CALLS_DIR: &str = "/sys/fs/cgroup/job";

/// Past this gVisor takes no number (its `pidMaxLimit`): unlimited.
const SENTRY_PIDS_UNLIMITED: u64 = 4 * 1024 * 1024;

/// Writes the sentry's own pids limit (ADR 0185): the sentry refuses a fork past it with
/// EAGAIN, as the jail's cgroup does, before the host cgroup around runsc (the sentry's
/// own threads and stubs on top) is reached, which the sentry would not survive.
fn set_sentry_pids_max(n: u64) -> Result<(), String> {
    let v = if n >= SENTRY_PIDS_UNLIMITED {
        "max".to_string()
    } else {
        n.to_string()
    };
    std::fs::write(SENTRY_PIDS_MAX, v.as_bytes())
        .map_err(|e| format!("write {SENTRY_PIDS_MAX} ({v}): {e}"))
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args::default();
    let mut it = std::env::args().skip(1);
    let fd = |v: Option<String>, flag: &str| -> Result<i32, String> {
        v.ok_or(format!("{flag} needs a value"))?
            .parse::<i32>()
            .map_err(|_| format!("{flag} needs a file descriptor number"))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--listen-fd" => args.listen_fd = Some(fd(it.next(), "--listen-fd")?),
            "--cgroup-fd" => args.cgroup_fd = Some(fd(it.next(), "--cgroup-fd")?),
            "--allow-no-landlock" => args.allow_no_landlock = true,
            "--tier" => args.tier = it.next().ok_or("--tier needs a value")?.parse()?,
            "--listen" => {
                let v = it.next().ok_or("--listen needs a value")?;
                let p = v.strip_prefix("unix:").ok_or("--listen takes unix:PATH")?;
                args.listen_path = Some(p.to_string());
            }
            #[cfg(feature = "insecure-test-hooks")]
            "--test-weaken" => testhooks::set(&it.next().ok_or("--test-weaken needs a value")?)?,
            // The gvisor tier runs this (`runsc exec`) before a disk checkpoint: the
            // sentry's own sync pushes out what it caches (ADR 0135).
            "--sync" => {
                let code = match threadbox_sys::clonefile::syncfs(std::path::Path::new("/")) {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("threadbox-agent: sync: {e}");
                        1
                    }
                };
                std::process::exit(code);
            }
            // A fork restored from its parent's memory image has the parent's hostname:
            // the gvisor tier sets the fork's own with this (`runsc exec -cap
            // CAP_SYS_ADMIN`) before the agent binds again (ADR 0136).
            "--hostname" => {
                let name = it.next().ok_or("--hostname needs a value")?;
                if let Err(e) = threadbox_sys::jail::set_hostname(&name) {
                    eprintln!("threadbox-agent: hostname: {e}");
                    std::process::exit(1);
                }
                std::process::exit(0);
            }
            "--pids-max" | "--set-pids-max" => {
                let n = it
                    .next()
                    .ok_or_else(|| format!("{a} needs a value"))?
                    .parse::<u64>()
                    .map_err(|_| format!("{a} needs a number"))?;
                if a == "--set-pids-max" {
                    // The daemon's live change of a running sandbox's limit (`runsc exec`).
                    if let Err(e) = set_sentry_pids_max(n) {
                        eprintln!("threadbox-agent: {e}");
                        std::process::exit(1);
                    }
                    std::process::exit(0);
                }
                args.pids_max = Some(n);
            }
            "--memory-max" => args.memory_max = Some(oom::parse_flag(&a, it.next())?),
            // The daemon's live change of a running sandbox's limit (`runsc exec`).
            "--set-memory-max" => {
                let r = oom::parse_flag(&a, it.next()).and_then(oom::set_limit);
                if let Err(e) = &r {
                    eprintln!("threadbox-agent: {e}");
                }
                std::process::exit(i32::from(r.is_err()));
            }
            "--version" => {
                println!("threadbox-agent {}", env!("CARGO_PKG_VERSION"));
                std::process::exit(0);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.listen_fd.is_some() == args.listen_path.is_some() {
        return Err("exactly one of --listen-fd and --listen is required".into());
    }
    Ok(args)
}

fn listener(args: &Args) -> Result<std::os::unix::net::UnixListener, String> {
    if let Some(fd) = args.listen_fd {
        let fd: OwnedFd =
            syschild::take_inherited_fd(fd).map_err(|e| format!("--listen-fd {fd}: {e}"))?;
        return Ok(std::os::unix::net::UnixListener::from(fd));
    }
    let path = args.listen_path.as_deref().unwrap_or_default();
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if meta.file_type().is_socket() {
            std::fs::remove_file(path).map_err(|e| format!("remove stale socket {path}: {e}"))?;
        }
    }
    let l =
        std::os::unix::net::UnixListener::bind(path).map_err(|e| format!("bind {path}: {e}"))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("chmod {path}: {e}"))?;
    Ok(l)
}

fn main() -> ExitCode {
    // The gvisor tier's pid namespace init (ADR 0218): before anything else runs.
    if std::env::args().nth(1).as_deref() == Some(syschild::pidns::INIT_ARG) {
        syschild::pidns::init_main();
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("threadbox-agent: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("threadbox-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    if args.tier == selftest::Tier::Gvisor && !testhooks::has("no-pidns") {
        // Sandbox processes in a pid namespace without the agent, whose /proc is that
        // namespace's (ADR 0218): made while the agent is single-threaded, has no child
        // and still holds CAP_SYS_ADMIN; the masks below then apply to that /proc.
        let init = syschild::pidns::enter_sandbox_namespace()
            .map_err(|e| format!("the sandbox's pid namespace: {e}"))?;
        log(&format!(
            "sandbox processes in a pid namespace of their own (init: pid {init})"
        ));
    }
    if args.tier == selftest::Tier::Gvisor {
        // The sentry's /proc/sys and sysrq-trigger read-only, as the jail's are (ADR 0191),
        // before anything of the sandbox runs; then CAP_SYS_ADMIN, given for this, goes.
        let done = threadbox_sys::gvisor::harden_proc_inside(
            !testhooks::has("no-proc-mask"),
            testhooks::has("keep-caps"),
        )
        .map_err(|e| format!("the gvisor tier's /proc masks: {e}"))?;
        log(&format!("read-only inside the sentry: {}", done.join(", ")));
    }
    // Nobody may ptrace us or read our memory through /proc.
    syschild::set_dumpable(false).map_err(|e| format!("PR_SET_DUMPABLE: {e}"))?;
    // Outside a pid namespace (host test mode) orphans still come to us to be reaped.
    if let Err(e) = syschild::set_child_subreaper() {
        log(&format!("PR_SET_CHILD_SUBREAPER failed: {e}"));
    }
    syschild::set_umask(0o022);
    // Before any child exists: everything started from here on is under it. Fails closed,
    // as a sandbox without its limit would be one fork bomb from losing its sentry.
    if let Some(n) = args.pids_max {
        set_sentry_pids_max(n)?;
    }
    // gvisor: the calls' cgroups are made in the sentry's own cgroupfs, where a timeout
    // can find a call's every process, also those that left its session (ADR 0214). Fails
    // closed, as the limit above does.
    let sentry_cgroup = match (args.cgroup_fd, args.pids_max) {
        (None, Some(_)) => Some(
            DirFd::open(std::path::Path::new(SENTRY_CALLS_DIR))
                .map_err(|e| format!("open {SENTRY_CALLS_DIR}: {e}"))?,
        ),
        _ => None,
    };
    // Likewise the memory limit the watchdog (started below) enforces (ADR 0205).
    if let Some(n) = args.memory_max {
        oom::set_limit(n)?;
    }
    // File operations run with a temporary fsuid/fsgid: no supplementary group of ours
    // may add rights to them.
    if let Err(e) = syschild::clear_supplementary_groups() {
        log(&format!("could not clear supplementary groups: {e}"));
    }

    let listener = listener(&args)?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listener: {e}"))?;
    let cgroup = match args.cgroup_fd {
        Some(fd) => {
            let owned =
                syschild::take_inherited_fd(fd).map_err(|e| format!("--cgroup-fd {fd}: {e}"))?;
            Some(DirFd::from_fd(owned).map_err(|e| format!("--cgroup-fd {fd}: {e}"))?)
        }
        None => None,
    };
    let policy = agent::PolicyParts::load()?;
    if let Some(reason) = &policy.landlock_missing {
        // Fail closed: a sandbox documented to have Landlock does not run without it,
        // unless the operator chose the weaker posture (selftest then shows it).
        if !args.allow_no_landlock {
            return Err(format!(
                "Landlock cannot be enforced on sandbox processes ({reason}); refusing to \
                 start (the operator can allow this with `serve --insecure-allow-no-landlock`)"
            ));
        }
        log(&format!(
            "Landlock is not enforced on sandbox processes: {reason} (allowed by the operator)"
        ));
    }
    // Both weakenings take the resolver's restrictions away (`files-follow` is the older
    // name of the file API's part of it, kept for the H cases' positive controls).
    let resolve = if testhooks::has("resolve-follow") || testhooks::has("files-follow") {
        Resolve::NONE
    } else {
        Resolve::STRICT
    };
    let root =
        Root::open(std::path::Path::new("/"), resolve).map_err(|e| format!("open /: {e}"))?;
    // Setup is done: from here on the agent runs under its own seccomp filter.
    own_filter::install()?;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let mut listener = Some(
            tokio::net::UnixListener::from_std(listener).map_err(|e| format!("listener: {e}"))?,
        );
        let v1 = sentry_cgroup.is_some();
        let mut agent = agent::Agent::new(root, cgroup.or(sentry_cgroup), policy, args.tier);
        agent.cgroup_v1 = v1;
        agent.listen_path = args.listen_path.clone();
        let agent = Rc::new(agent);
        // The host's "bind again" after a memory checkpoint's restore (ADR 0130). Installed
        // before anything can be asked to quiesce; one arriving while we listen is dropped.
        let mut rebind =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())
                .map_err(|e| format!("SIGUSR2 handler: {e}"))?;
        let mut quiesced = agent.quiesce.subscribe();
        // The SIGCHLD handler must exist before the first child is started.
        let reaper = agent::Reaper::install().map_err(|e| format!("SIGCHLD handler: {e}"))?;
        tokio::task::spawn_local(reaper.run(agent.clone()));
        if args.memory_max.is_some() {
            tokio::task::spawn_local(oom::watch());
        }
        log(&format!(
            "threadbox-agent {} ready (pid {})",
            env!("CARGO_PKG_VERSION"),
            std::process::id()
        ));
        loop {
            let Some(l) = listener.as_ref() else {
                // Quiesced: nothing of ours is bound on the host until the restore (or a
                // checkpoint that failed) is over.
                let after = quiesced.borrow_and_update().rebind_after_ms;
                tokio::select! {
                    _ = rebind.recv() => {}
                    _ = tokio::time::sleep(std::time::Duration::from_millis(after)) => {
                        // Held until binding, as every line since the prepare.
                        log("no word from the host after a checkpoint; binding again");
                    }
                    // Another prepare meanwhile: wait on with its deadline.
                    _ = quiesced.changed() => continue,
                }
                // The checkpoint is over (or never came): the log is safe to write again.
                release_log();
                listener = bind_again(args.listen_path.as_deref()).await;
                continue;
            };
            let accepted = tokio::select! {
                biased;
                _ = quiesced.changed() => {
                    // Nothing is logged here: a write to the host's log file that the
                    // checkpoint interrupts does not finish after the restore (seen with
                    // runsc 20240729). `PrepareCheckpoint` logged before answering.
                    // Its registration is leaked, not freed: a late event of the host
                    // socket must not reach freed memory (ADR 0196).
                    if let Some(l) = listener.take() {
                        threadbox_sys::fs::close_leaking_owner(l);
                    }
                    continue;
                }
                _ = rebind.recv() => continue,
                a = l.accept() => a,
            };
            match accepted {
                Ok((stream, _)) => {
                    tokio::task::spawn_local(conn::serve(agent.clone(), stream));
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    log(&format!("accept: {e}"));
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    })
}

/// Binds the listener again at `path` after a checkpoint, retrying a failure (logged)
/// rather than leaving the sandbox unreachable.
async fn bind_again(path: Option<&str>) -> Option<tokio::net::UnixListener> {
    let path = path?;
    let args = Args {
        listen_path: Some(path.to_string()),
        ..Args::default()
    };
    loop {
        match listener(&args).and_then(|l| {
            l.set_nonblocking(true).map_err(|e| e.to_string())?;
            tokio::net::UnixListener::from_std(l).map_err(|e| e.to_string())
        }) {
            Ok(l) => {
                log("listening again after a checkpoint");
                return Some(l);
            }
            Err(e) => {
                log(&format!("binding again after a checkpoint: {e}"));
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Lines logged while quiesced for a checkpoint, written once the agent binds again.
static HELD: std::sync::Mutex<Option<Vec<String>>> = std::sync::Mutex::new(None);
/// At most this many lines are held; later ones are counted, not kept.
const HELD_MAX: usize = 64;

/// One line to the agent's log (its stderr, which the host keeps), or, while quiesced
/// for a checkpoint ([`hold_log`]), into memory until [`release_log`].
pub fn log(msg: &str) {
    let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(lines) = held.as_mut() {
        if lines.len() < HELD_MAX {
            lines.push(msg.to_string());
        }
        return;
    }
    drop(held);
    eprintln!("threadbox-agent: {msg}");
}

/// From here until [`release_log`] nothing is written to the log. Its stderr is a host
/// file: a write the checkpoint catches in flight never finishes after the restore (runsc
/// 20240729), and the agent would hang in it, never binding again. Anything may log in
/// that window (a connection reset by a daemon that died during the save, say).
pub fn hold_log() {
    let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    held.get_or_insert_with(Vec::new);
}

/// Writes what was held and logs directly again.
pub fn release_log() {
    let lines = HELD
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .unwrap_or_default();
    let dropped = lines.len() >= HELD_MAX;
    for l in lines {
        eprintln!("threadbox-agent: {l}");
    }
    if dropped {
        eprintln!("threadbox-agent: (later lines of the checkpoint's window were dropped)");
    }
}
