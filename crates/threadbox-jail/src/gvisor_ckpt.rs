//! Memory checkpoints of the gvisor tier (issue 16 scope 3, ADR 0130): `runsc checkpoint`
//! of a sandbox's container — its processes and memory, the sentry's whole state — into a
//! directory, and `runsc restore` of such a directory into a container on a disk.
//!
//! The primitive, for hibernate and for fork with memory:
//! - [`GvisorDriver::checkpoint_memory`]: container `id` into `dir`. The image is written
//!   into a temporary directory beside `dir`, fsynced, and renamed: `dir` either does not
//!   exist or holds a complete image. The container exits (runsc's checkpoint without
//!   `-leave-running`); its cgroup and mounts are left to the caller ([`Gvisor::halt`]).
//! - [`GvisorDriver::restore_memory`]: image `dir` into the container of `spec` (its id,
//!   disk, overlay, cgroup and bundle, made as a boot makes them, through the launch
//!   helper's mount namespace), then the agent is told to bind its socket again.
//!
//! Before a checkpoint the agent must have been sent `PrepareCheckpoint` (it closes its
//! host-bound listener and connections, which runsc 20240729 cannot save); the daemon
//! holds the connection, so that is the manager's part. [`GvisorDriver::rebind`] undoes it
//! when the checkpoint is not taken after all.

use crate::gvisor::{run_bounded, Gvisor, GvisorDriver, RUNSC_DEADLINE};
use std::path::{Path, PathBuf};
use std::time::Instant;
use threadbox_core::driver::SandboxSpec;
use threadbox_core::error::{CoreError, Result};

/// How long a restored sandbox's control server has to accept the "bind again" signal
/// before the restore counts as failed (the wake then tries the image once more).
const RESTORE_UP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(20);

/// How often a rebind is tried again while the control server does not accept: a connect
/// is cheap, so the wake is late by at most this much.
const RETRY: std::time::Duration = std::time::Duration::from_millis(2);

/// Where a hibernated sandbox's memory image lives: `sandboxes/<id>/hibernate/`.
pub const HIBERNATE_DIR: &str = "hibernate";

/// A memory image, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryImage {
    /// Bytes of its files (runsc compresses the memory).
    pub bytes: u64,
    /// How long `runsc checkpoint` took.
    pub ms: u64,
}

/// The lock a checkpoint into `dir` or a restore from it holds while it runs: `.<dir>.lock`.
pub(crate) fn lock_of(dir: &Path) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.with_file_name(format!(".{name}.lock"))
}

/// A command that runs what follows its arguments holding `dir`'s lock (`flock(1)`).
/// The lock, not the daemon, spans the whole checkpoint or restore: a daemon killed
/// during one leaves it running to its end (the sentry saves on its own anyway), and the
/// next daemon waits for the lock before it looks at the image (ADR 0130).
pub(crate) fn under_lock(dir: &Path) -> Result<std::process::Command> {
    let flock = crate::gvisor::on_path("flock").ok_or_else(|| {
        CoreError::Unavailable("hibernate on gvisor needs flock(1) (util-linux) on PATH".into())
    })?;
    let mut c = std::process::Command::new(flock);
    c.arg(lock_of(dir));
    Ok(c)
}

/// Waits (bounded) until no checkpoint or restore of `dir` holds its lock.
pub(crate) fn wait_unlocked(dir: &Path) {
    let Some(flock) = crate::gvisor::on_path("flock") else {
        return;
    };
    // flock(1) takes its options before the lock file: after it they would be the command.
    let mut c = std::process::Command::new(flock);
    c.args(["-w", "120"]).arg(lock_of(dir)).arg("true");
    if let Err(e) = run_bounded(c, std::time::Duration::from_secs(130)) {
        tracing::warn!("waiting for {}: {e}", lock_of(dir).display());
    }
}

/// The temporary name a checkpoint into `dir` writes first.
fn tmp_of(dir: &Path) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.with_file_name(format!(".{name}.tmp"))
}

/// Sum of the sizes of the files of `dir` (not recursive: runsc writes flat files).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// `sh -ec CHECKPOINT_SH sh TMP DIR RUNSC ARGS…`: runs the checkpoint into TMP, fsyncs
/// its files and itself, renames it to DIR and fsyncs DIR's parent.
const CHECKPOINT_SH: &str = r#"tmp=$1; dir=$2; shift 2
"$@"
sync "$tmp" "$tmp"/*
mv -T "$tmp" "$dir"
sync "${dir%/*}""#;

fn remove_dir(dir: &Path) {
    // An image is "its directory exists" (`is_memory_image`), so it goes in one rename
    // first: a daemon killed during the removal finds the whole image or none, never a
    // directory without its `checkpoint.img` taken for an image (a crash trial at
    // wake-listening found one, and the restored processes were ended for it).
    let gone = gone_of(dir);
    remove_all(&gone);
    match std::fs::rename(dir, &gone) {
        Ok(()) => remove_all(&gone),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!("rename {} away: {e}", dir.display());
            remove_all(dir);
        }
    }
}

/// Where [`remove_dir`] renames `dir` to before removing it.
fn gone_of(dir: &Path) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.with_file_name(format!(".{name}.gone"))
}

fn remove_all(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("remove {}: {e}", dir.display()),
    }
}

impl Gvisor {
    /// `sandboxes/<id>/hibernate/`.
    pub(crate) fn memory_image_dir(&self, id: &str) -> PathBuf {
        self.j().paths(id).dir.join(HIBERNATE_DIR)
    }

    /// Whether `dir` holds a complete image (only a renamed one ever does).
    pub(crate) fn is_memory_image(dir: &Path) -> bool {
        dir.is_dir()
    }

    /// Removes sandbox `id`'s hibernate image and any half-written one.
    pub(crate) fn remove_memory_image(&self, id: &str) {
        Self::remove_image_at(&self.memory_image_dir(id));
    }

    pub(crate) fn checkpoint_memory(&self, id: &str, dir: &Path) -> Result<MemoryImage> {
        let info = self.runsc()?;
        crate::gvisor_net::refuse_memory_image(self.j(), id)?;
        if dir.exists() {
            return Err(CoreError::Conflict(format!(
                "a memory image already exists at {}",
                dir.display()
            )));
        }
        let tmp = tmp_of(dir);
        remove_dir(&tmp);
        crate::mkdir(&tmp)?;
        let started = Instant::now();
        // checkpoint, fsync, rename, as one process tree under the lock: it finishes even
        // if the daemon dies, so a complete image is always renamed, a partial never.
        let mut c = under_lock(dir)?;
        c.args(["sh", "-ec", CHECKPOINT_SH, "sh"])
            .arg(&tmp)
            .arg(dir)
            .arg(&info.path)
            .args(self.global_args())
            .args(["checkpoint", "-image-path"])
            .arg(&tmp)
            .arg(id);
        let r = run_bounded(c, RUNSC_DEADLINE);
        let ms = started.elapsed().as_millis() as u64;
        if let Err(e) = r {
            remove_dir(&tmp);
            return Err(CoreError::Internal(format!("runsc checkpoint {id}: {e}")));
        }
        if !Self::is_memory_image(dir) {
            return Err(CoreError::Internal(format!(
                "runsc checkpoint {id}: no image at {}",
                dir.display()
            )));
        }
        Ok(MemoryImage {
            bytes: dir_bytes(dir),
            ms,
        })
    }

    pub(crate) fn restore_memory(&self, spec: &SandboxSpec, dir: &Path) -> Result<i32> {
        if !Self::is_memory_image(dir) {
            return Err(CoreError::NotFound(format!(
                "no memory image at {}",
                dir.display()
            )));
        }
        let pid = self.launch_as(spec, Some(dir))?;
        Ok(pid)
    }

    /// Tells the agent of container `id` to bind its socket again (`SIGUSR2`; an agent
    /// that is listening ignores it).
    pub(crate) fn rebind(&self, id: &str) -> Result<()> {
        self.rebind_within(id, RUNSC_DEADLINE)
    }

    /// [`Gvisor::rebind`], giving up after `limit`.
    fn rebind_within(&self, id: &str, limit: std::time::Duration) -> Result<()> {
        use crate::gvisor::{control, state::ContainerState};
        self.runsc()?;
        // The control server's own call, not `runsc kill` (ADR 0217). Right after
        // `restore -detach` returns it may not accept yet: retried until the deadline (a
        // signal sent before it accepts is simply not delivered). The socket is read from
        // the state each try, as a restore may still be writing it.
        let st = ContainerState::new(&self.state_dir(), id);
        let deadline = Instant::now() + limit;
        loop {
            let per_call = deadline
                .saturating_duration_since(Instant::now())
                .clamp(RETRY, RUNSC_DEADLINE);
            match control::signal_init(&st.control_socket(), id, libc::SIGUSR2, per_call) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(CoreError::Internal(format!(
                        "tell the agent of {id} to bind again (SIGUSR2): {e}"
                    )))
                }
                Err(e) => {
                    tracing::trace!(sandbox = %id, "rebind not delivered yet: {e}");
                    std::thread::sleep(RETRY);
                }
            }
        }
    }

    /// Hibernate: the (prepared) sandbox's memory into its image, then nothing of it runs.
    pub(crate) fn hibernate(&self, id: &str) -> Result<MemoryImage> {
        // runsc cannot save its host network (a sandbox with egress runs on one, ADR 0140),
        // and a checkpoint that fails ends the sandbox: refused before it is tried.
        if self.j().paths(id).run.join(crate::NETNS_FILE).exists() {
            return Err(CoreError::Unavailable(
                "hibernate is not supported yet for a gvisor sandbox that uses the network \
                 (runsc cannot checkpoint its host network); pause it instead"
                    .into(),
            ));
        }
        let dir = self.memory_image_dir(id);
        // A complete image left by an interrupted wake is older than what runs now.
        remove_dir(&dir);
        let image = self.checkpoint_memory(id, &dir)?;
        let t = Instant::now();
        if let Err(e) = self.halt(id) {
            tracing::warn!(sandbox = %id, "after its checkpoint: {e}");
        }
        tracing::info!(sandbox = %id, bytes = image.bytes, checkpoint_ms = image.ms,
            halt_ms = t.elapsed().as_millis() as u64, "memory image written");
        Ok(image)
    }

    /// Wake: the image restored (its agent told to bind again) and removed, or, with no
    /// image (a hibernate whose checkpoint failed), the running agent told to bind again.
    /// The new sentry's pid when a restore ran.
    pub(crate) fn wake(&self, spec: &SandboxSpec) -> Result<Option<i32>> {
        let dir = self.memory_image_dir(&spec.id);
        if !Self::is_memory_image(&dir) {
            if self.j().cgroup(&spec.id).exists() {
                self.rebind(&spec.id)?;
            }
            return Ok(None);
        }
        let t = Instant::now();
        let (pid, restore_ms, rebind_ms) = match self.restore_once(spec, &dir, t) {
            Ok(r) => r,
            Err(e) => {
                // Seen once in some dozens of crash trials (a wake after a daemon killed
                // during a restore): the restored sentry's control server never
                // accepted, and the sentry then died. The image is untouched by a
                // restore, so the wake tries it once more from a clean slate (ADR 0197).
                tracing::warn!(sandbox = %spec.id, "a restore did not come up; once more from the same image: {e}");
                if let Err(h) = self.halt(&spec.id) {
                    tracing::warn!(sandbox = %spec.id, "clearing the failed restore: {h}");
                }
                self.restore_once(spec, &dir, Instant::now())?
            }
        };
        remove_dir(&dir);
        tracing::info!(sandbox = %spec.id, restore_ms, rebind_ms,
            total_ms = t.elapsed().as_millis() as u64, "memory image restored");
        Ok(Some(pid))
    }

    /// One restore of image `dir` up to a listening agent: the sentry's pid and how long
    /// the restore and the signal took.
    fn restore_once(&self, spec: &SandboxSpec, dir: &Path, t: Instant) -> Result<(i32, u64, u64)> {
        let pid = self.restore_memory(spec, dir)?;
        let restore_ms = t.elapsed().as_millis() as u64;
        // A restored control server accepts within a second or two even on a loaded
        // host; one that has not in this long is a restore that failed.
        self.rebind_within(&spec.id, RESTORE_UP_DEADLINE)?;
        let rebind_ms = t.elapsed().as_millis() as u64 - restore_ms;
        // The sentry may still be reading the image after `restore -detach` returned
        // (one removed at once killed it): it goes once the agent answers. A daemon
        // killed before that finds the image and the restored processes are ended
        // (ADR 0130).
        self.wait_listening(&spec.id)?;
        Ok((pid, restore_ms, rebind_ms))
    }

    /// Waits (bounded) until the restored agent of `id` listens again.
    pub(crate) fn wait_listening(&self, id: &str) -> Result<()> {
        let sock = self.socket(id);
        let deadline = Instant::now() + RUNSC_DEADLINE;
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            if Instant::now() > deadline {
                return Err(CoreError::Unavailable(format!(
                    "the restored agent of {id} did not listen within {}s",
                    RUNSC_DEADLINE.as_secs()
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        Ok(())
    }

    /// Removes the image at `dir` with what a checkpoint into it leaves beside it.
    pub(crate) fn remove_image_at(dir: &Path) {
        remove_dir(&tmp_of(dir));
        remove_dir(dir);
        let _ = std::fs::remove_file(lock_of(dir));
    }

    /// After a daemon restart: whether sandbox `id` is hibernated in a complete image.
    /// What a wake that did not finish left running is ended: the image is the truth.
    pub(crate) fn recover_hibernated(&self, id: &str) -> bool {
        // A save with memory (fork, checkpoint) a killed daemon left may make it hibernated.
        self.recover_interrupted_save(id);
        let dir = self.memory_image_dir(id);
        // A checkpoint or restore a killed daemon started runs to its end first.
        if lock_of(&dir).exists() {
            wait_unlocked(&dir);
        }
        remove_dir(&tmp_of(&dir));
        // What a daemon killed while removing an image had renamed away.
        remove_all(&gone_of(&dir));
        if !Self::is_memory_image(&dir) {
            self.rebind_if_quiesced(id);
            return false;
        }
        if let Err(e) = self.halt(id) {
            tracing::warn!(sandbox = %id, "clearing an interrupted wake: {e}");
        }
        true
    }
}

impl Gvisor {
    /// At a start: a running (not frozen) sandbox whose agent does not listen was left
    /// quiesced by a daemon killed after its `PrepareCheckpoint` (no save began, or one
    /// failed and its undo did not finish): it is told to bind again now rather than by
    /// its own 30 s deadline. Safe for an agent that has run (its handler is installed
    /// before it first listens; one that listens ignores the signal); never sent to a
    /// frozen sentry, which could not answer runsc.
    fn rebind_if_quiesced(&self, id: &str) {
        if self.j().is_frozen(id).unwrap_or(true) {
            tracing::debug!(sandbox = %id, "frozen (or unknown): not told to bind again");
            return;
        }
        if agent_says_hello(&self.socket(id)) {
            tracing::debug!(sandbox = %id, "its agent answers: not told to bind again");
            return;
        }
        if !self.sentry_alive(id) {
            tracing::debug!(sandbox = %id, "no live sentry: not told to bind again");
            return;
        }
        tracing::info!(sandbox = %id, "its agent was left quiesced for a checkpoint: told to bind again");
        if let Err(e) = self.rebind(id) {
            tracing::warn!(sandbox = %id, "{e}");
        }
    }
}

/// Whether an agent listens at `sock`: it greets every connection it accepts first.
///
/// A socket that merely accepts proves nothing under runsc 20240729: a host-bound listener
/// the sandbox closed keeps accepting on the host (into its backlog, never answered) until
/// its process exits, so an agent quiesced for a checkpoint looks like one that listens.
/// A slow agent that misses the wait is told to bind again, which it ignores.
fn agent_says_hello(sock: &Path) -> bool {
    use std::io::Read;
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(sock) else {
        return false;
    };
    if s.set_read_timeout(Some(std::time::Duration::from_millis(500)))
        .is_err()
    {
        return false;
    }
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(n) if n > 0)
}

impl GvisorDriver {
    /// Checkpoints container `id` (its agent prepared) into `dir`, whole or not at all.
    pub async fn checkpoint_memory(&self, id: &str, dir: &Path) -> Result<MemoryImage> {
        let (id, dir) = (id.to_string(), dir.to_path_buf());
        self.run(move |g| g.checkpoint_memory(&id, &dir)).await
    }

    /// Restores image `dir` into `spec`'s container, on `spec`'s disk; the sentry's pid.
    /// The agent is not told to bind yet: [`GvisorDriver::rebind`].
    pub async fn restore_memory(&self, spec: &SandboxSpec, dir: &Path) -> Result<i32> {
        let (spec, dir) = (spec.clone(), dir.to_path_buf());
        self.run(move |g| g.restore_memory(&spec, &dir)).await
    }

    /// Tells container `id`'s agent to bind its socket again.
    pub async fn rebind(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.run(move |g| g.rebind(&id)).await
    }

    /// `sandboxes/<id>/hibernate/`.
    pub fn memory_image_dir(&self, id: &str) -> PathBuf {
        self.0.memory_image_dir(id)
    }
}
