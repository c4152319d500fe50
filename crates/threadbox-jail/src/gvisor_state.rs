//! runsc's per-container state in `<root>/gvisor/state`, and its removal without
//! `runsc delete` once the container's processes have exited (ADR 0212).
//!
//! `runsc delete -force` of a container whose sentry and gofer have already exited still
//! waits until they are *reaped*: it polls `kill(pid, 0)`, which a zombie answers, every
//! 100 ms (`Sandbox.waitForStopped` in runsc/sandbox/sandbox.go, `Container.waitForStopped`
//! in runsc/container/container.go, release-20240729.0). Both are orphans (`runsc run
//! -detach` exits at once), so their reaper is the host's init, which took 1.3–1.7 s here:
//! that was the whole of a halt. For the containers this tier makes (`--ignore-cgroups`,
//! `--overlay2=none`, no hooks, no mount annotations) what `Container.Destroy` does beyond
//! that wait is to remove three files: the control socket (`Sandbox.destroy`), then the
//! state and lock files (`StateFile.Destroy`), the lock held. [`ContainerState::remove_exited`]
//! does exactly that, after checking the state file says nothing more is to be done;
//! anything else is left to `runsc delete`.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why the state was not removed here: `runsc delete` is asked instead.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unremovable {
    #[error("a runsc command of the container held its lock for {0:?}")]
    Locked(Duration),
    #[error("process {0} of the container is still running")]
    Running(i64),
    #[error("the state asks runsc for more than removing its files: {0}")]
    MoreToDo(&'static str),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the state file is not runsc's JSON: {0}")]
    Unreadable(#[from] serde_json::Error),
}

/// The files runsc keeps for the root container `id` under its `--root` `dir` (the
/// sandbox id is the container id on this tier).
pub(crate) struct ContainerState {
    dir: PathBuf,
    id: String,
}

impl ContainerState {
    pub(crate) fn new(dir: &Path, id: &str) -> Self {
        ContainerState {
            dir: dir.to_path_buf(),
            id: id.to_string(),
        }
    }

    /// `buildPath` in runsc/container/state_file.go: `<cid>_sandbox:<sid>.<ext>`.
    fn file(&self, ext: &str) -> PathBuf {
        self.dir
            .join(format!("{id}_sandbox:{id}.{ext}", id = self.id))
    }

    /// `createControlSocket` in runsc/sandbox/sandbox.go, first choice (the root dir).
    fn default_socket(&self) -> PathBuf {
        self.dir.join(self.socket_name())
    }

    fn socket_name(&self) -> String {
        format!("runsc-{}.sock", self.id)
    }

    /// The state runsc saved for the container, when there is one that reads as JSON.
    /// Read without runsc's lock: runsc writes it before `run` or `restore -detach`
    /// returns, and a file caught mid-write reads as nothing (the caller asks runsc).
    fn saved(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&std::fs::read(self.file("state")).ok()?).ok()
    }

    /// The sentry's host pid as runsc saved it (`sandbox.pid`, what `runsc state` prints
    /// as `pid`), when the state has one and it runs: `runsc state` prints -1 for a
    /// container whose sandbox has exited (`Container.SandboxPid`), so a dead one is
    /// none here too.
    pub(crate) fn sandbox_pid(&self) -> Option<i32> {
        self.saved()?["sandbox"]["pid"]
            .as_i64()
            .filter(|p| *p > 0 && !exited(*p))
            .and_then(|p| i32::try_from(p).ok())
    }

    /// The sandbox's control socket (`sandbox.controlSocketPath`), when the state names
    /// one of this container's name; else runsc's first choice.
    pub(crate) fn control_socket(&self) -> PathBuf {
        self.saved()
            .and_then(|s| self.named_socket(&s).ok())
            .unwrap_or_else(|| self.default_socket())
    }

    /// Whether runsc has anything of the container.
    pub(crate) fn exists(&self) -> bool {
        [self.file("state"), self.file("lock"), self.default_socket()]
            .iter()
            .any(|p| p.symlink_metadata().is_ok())
    }

    /// Removes the container's files as `runsc delete` would, if its processes have all
    /// exited (zombies included) and the state names nothing else delete would undo.
    /// Waits at most `lock_wait` for a runsc command of the container that holds its
    /// lock, as delete itself would wait.
    pub(crate) fn remove_exited(&self, lock_wait: Duration) -> Result<(), Unremovable> {
        // runsc's own lock (`StateFile.lock`, flock on the lock file): no runsc command of
        // this container is between reading and writing its state while we remove it.
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.file("lock"))?;
        let deadline = Instant::now() + lock_wait;
        while !threadbox_sys::fs::try_lock_exclusive(lock.as_fd())? {
            if Instant::now() > deadline {
                return Err(Unremovable::Locked(lock_wait));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let socket = match std::fs::read(self.file("state")) {
            Ok(bytes) => self.check(&serde_json::from_slice(&bytes)?)?,
            // No container (a create that failed early, a delete cut short): what is
            // left is ours to remove, runsc would find nothing to load.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.default_socket(),
            Err(e) => return Err(e.into()),
        };
        for p in [socket, self.file("state"), self.file("lock")] {
            match std::fs::remove_file(&p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        drop(lock);
        Ok(())
    }

    /// What `Container.Destroy` would do for the container in `state` is only removing
    /// its files: the control socket to remove, or why not.
    fn check(&self, state: &serde_json::Value) -> Result<PathBuf, Unremovable> {
        let null_or_empty =
            |v: &serde_json::Value| v.is_null() || v.as_array().is_some_and(|a| a.is_empty());
        // `stop` uninstalls these (cgroups runsc made: none under --ignore-cgroups).
        if !state["sandbox"]["cgroup"]["cgroup"].is_null()
            || !state["compatCgroup"]["cgroup"].is_null()
        {
            return Err(Unremovable::MoreToDo("a cgroup of runsc's"));
        }
        // Run after the delete (none in our config.json).
        if !null_or_empty(&state["spec"]["hooks"]["poststop"]) {
            return Err(Unremovable::MoreToDo("poststop hooks"));
        }
        // `forEachSelfMount`: a self-backed overlay (upper 2, SelfOverlay) has a filestore
        // file to delete; --overlay2=none makes every upper 0 (NoOverlay).
        let confs = &state["goferMountConfs"];
        if !confs.is_null()
            && !confs
                .as_array()
                .is_some_and(|a| a.iter().all(|c| c["upper"].as_u64() == Some(0)))
        {
            return Err(Unremovable::MoreToDo("an overlay with a filestore"));
        }
        // Shared mount hints have filestores of their own.
        if state["spec"]["annotations"]
            .as_object()
            .is_some_and(|a| a.keys().any(|k| k.starts_with("dev.gvisor.spec.mount.")))
        {
            return Err(Unremovable::MoreToDo("mount hints"));
        }
        for pid in [&state["sandbox"]["pid"], &state["goferPid"]] {
            let pid = pid.as_i64().unwrap_or(0);
            if pid > 0 && !exited(pid) {
                return Err(Unremovable::Running(pid));
            }
        }
        self.named_socket(state)
    }

    /// The control socket `state` names: runsc falls back to /var/run, /run, /tmp for a
    /// root dir too long for a socket path, so the state says which; only a socket of
    /// this container's name is taken (removed, or called).
    fn named_socket(&self, state: &serde_json::Value) -> Result<PathBuf, Unremovable> {
        match state["sandbox"]["controlSocketPath"].as_str() {
            None | Some("") => Ok(self.default_socket()),
            Some(p) => {
                let p = PathBuf::from(p);
                if p.is_absolute()
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy() == self.socket_name())
                {
                    Ok(p)
                } else {
                    Err(Unremovable::MoreToDo("a control socket of another name"))
                }
            }
        }
    }
}

/// Whether `pid` has exited: gone, or a zombie (its parent, the host's init for runsc's
/// orphans, has not reaped it yet; nothing of it runs and it holds no files).
fn exited(pid: i64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the field after the command's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|s| s == "Z" || s == "X"),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path, id: &str, state: &serde_json::Value) -> ContainerState {
        let st = ContainerState::new(dir, id);
        std::fs::write(st.file("state"), state.to_string()).expect("state");
        std::fs::write(st.file("lock"), "").expect("lock");
        std::fs::write(st.default_socket(), "").expect("socket");
        st
    }

    fn left(dir: &Path) -> usize {
        std::fs::read_dir(dir).expect("dir").count()
    }

    #[test]
    fn the_state_of_exited_processes_is_removed() {
        let d = tempfile::tempdir().expect("tmp");
        let st = files(
            d.path(),
            "sb-1",
            &serde_json::json!({
                "goferPid": 0,
                "sandbox": {"pid": 0, "cgroup": {"cgroup": null},
                    "controlSocketPath": d.path().join("runsc-sb-1.sock")},
                "compatCgroup": {"cgroup": null},
                "goferMountConfs": [{"upper": 0, "lower": 1}],
                "spec": {},
            }),
        );
        assert!(st.exists());
        st.remove_exited(Duration::from_secs(1)).expect("removed");
        assert!(!st.exists());
        assert_eq!(left(d.path()), 0);
    }

    #[test]
    fn a_running_process_or_more_work_is_left_to_runsc() {
        let d = tempfile::tempdir().expect("tmp");
        let me = i64::from(std::process::id());
        for state in [
            serde_json::json!({"goferPid": me, "sandbox": {"pid": 0}}),
            serde_json::json!({"sandbox": {"pid": 0, "cgroup": {"cgroup": {"name": "x"}}}}),
            serde_json::json!({"goferMountConfs": [{"upper": 2, "lower": 1}]}),
            serde_json::json!({"spec": {"hooks": {"poststop": [{"path": "/bin/true"}]}}}),
            serde_json::json!({"sandbox": {"controlSocketPath": "/etc/passwd"}}),
        ] {
            let st = files(d.path(), "sb-2", &state);
            assert!(st.remove_exited(Duration::from_secs(1)).is_err(), "{state}");
            assert_eq!(left(d.path()), 3, "{state}: nothing removed");
        }
    }

    #[test]
    fn a_held_lock_is_waited_for_then_left_to_runsc() {
        let d = tempfile::tempdir().expect("tmp");
        let st = files(d.path(), "sb-3", &serde_json::json!({}));
        let held = std::fs::File::open(st.file("lock")).expect("open");
        assert!(threadbox_sys::fs::try_lock_exclusive(held.as_fd()).expect("flock"));
        assert!(matches!(
            st.remove_exited(Duration::from_millis(20)),
            Err(Unremovable::Locked(_))
        ));
        drop(held);
        st.remove_exited(Duration::from_secs(1)).expect("removed");
        assert_eq!(left(d.path()), 0);
    }

    #[test]
    fn the_saved_pid_is_the_sentrys_only_while_it_runs() {
        let d = tempfile::tempdir().expect("tempdir");
        let me = i64::from(std::process::id());
        let st = files(
            d.path(),
            "sb-4",
            &serde_json::json!({"sandbox": {"pid": me}}),
        );
        assert_eq!(st.sandbox_pid(), i32::try_from(me).ok());
        let gone = files(
            d.path(),
            "sb-5",
            &serde_json::json!({"sandbox": {"pid": i64::from(i32::MAX)}}),
        );
        assert_eq!(gone.sandbox_pid(), None);
        let none = files(
            d.path(),
            "sb-6",
            &serde_json::json!({"sandbox": {"pid": -1}}),
        );
        assert_eq!(none.sandbox_pid(), None);
        assert_eq!(ContainerState::new(d.path(), "sb-7").sandbox_pid(), None);
    }

    #[test]
    fn zombies_and_missing_pids_have_exited() {
        assert!(!exited(i64::from(std::process::id())));
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pid = i64::from(child.id());
        // Unreaped until wait: a zombie once it has run (bounded by the deadline).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !exited(pid) {
            assert!(Instant::now() < deadline, "true did not exit");
            std::thread::sleep(Duration::from_millis(2));
        }
        child.wait().expect("wait");
        assert!(exited(pid));
    }
}
