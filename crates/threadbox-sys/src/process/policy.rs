//! [`ChildPolicy`]: what a sandbox process goes through between fork and exec.
//!
//! The policy is built before fork (all allocation happens there) and
//! [`ChildPolicy::enter`] runs in the child using raw system calls only, so it is
//! async-signal-safe and may run in a `pre_exec` hook.

use crate::landlock::Ruleset;
use crate::raw;
use crate::seccomp::sock_filter;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// Everything a child needs to drop into the sandbox's process policy.
#[derive(Debug)]
pub struct ChildPolicy {
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub groups: Vec<libc::gid_t>,
    /// The working directory, as a handle the agent resolved under the sandbox root
    /// ([`crate::resolve::Root`]); the child `fchdir`s to it after dropping its ids, so the
    /// user's search permission applies and no path is walked between fork and exec.
    pub cwd: Option<OwnedFd>,
    /// An fd of a cgroup v2 `cgroup.procs` file opened for writing; the child moves itself
    /// there first, so everything it starts is in that cgroup.
    pub cgroup_procs: Option<OwnedFd>,
    pub landlock: Option<Arc<Ruleset>>,
    pub seccomp: Arc<Vec<sock_filter>>,
    /// Test-only weakenings (positive controls of the security suite). Always present so
    /// that the struct has one shape whichever crates enable the feature (F14); without
    /// the feature it is zero-sized and nothing reads it.
    pub weaken: Weaken,
}

/// The weakenings a child applies (the security suite's positive controls).
#[cfg(feature = "insecure-test-hooks")]
pub use crate::testhooks::Weaken;

/// No weakening exists in a build without the `insecure-test-hooks` feature.
#[cfg(not(feature = "insecure-test-hooks"))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Weaken;

const OOM_SCORE_ADJ: &CStr = c"/proc/self/oom_score_adj";
/// User processes are the OOM killer's first choice, before the agent.
const OOM_SCORE_ADJ_VALUE: &[u8] = b"500";

/// All bits that can be set in the secure bits (see capabilities(7)): no privilege for uid 0
/// on exec, no capability fix-up on uid changes, no ambient raise; each locked.
const SECUREBITS: libc::c_ulong = (1 << 0) // NOROOT
    | (1 << 1) // NOROOT_LOCKED
    | (1 << 2) // NO_SETUID_FIXUP
    | (1 << 3) // NO_SETUID_FIXUP_LOCKED
    | (1 << 5) // KEEP_CAPS_LOCKED (KEEP_CAPS itself off)
    | (1 << 6) // NO_CAP_AMBIENT_RAISE
    | (1 << 7); // NO_CAP_AMBIENT_RAISE_LOCKED

impl ChildPolicy {
    /// Enters the policy. Runs in the forked child before exec: raw system calls only,
    /// no allocation, no locks. The order matters:
    ///
    /// 1. every inherited fd ≥ 3 is closed except the few the child itself needs (its cwd
    ///    handle, cgroup.procs, the Landlock ruleset, `keep`): nothing of the agent — its
    ///    sockets, the sandbox's cgroup directory — exists in the child past this point;
    /// 2. join the cgroup, `setsid`, raise `oom_score_adj`;
    /// 3. while still privileged: clear ambient caps, empty the bounding set, lock the
    ///    secure bits (where permitted);
    /// 4. `setgroups`, `setresgid`, `setresuid` (raw syscalls, not glibc's setxid broadcast);
    /// 5. `capset` to zero every set, `chdir` as the user;
    /// 6. no_new_privs, Landlock, and seccomp last (it would refuse the calls above).
    pub fn enter(&self) -> io::Result<()> {
        self.enter_keeping(&[])
    }

    /// [`ChildPolicy::enter`], keeping the descriptors `keep` open as well.
    pub fn enter_keeping(&self, keep: &[RawFd]) -> io::Result<()> {
        self.close_fds(keep)?;

        if let Some(fd) = &self.cgroup_procs {
            if raw::fd::write(fd.as_fd(), b"0")? != 1 {
                return Err(io::Error::last_os_error());
            }
        }
        raw::process::setsid()?;

        // Best effort: a missing /proc must not stop the process. The fd closes on drop.
        if let Ok(fd) = raw::fd::open(OOM_SCORE_ADJ, libc::O_WRONLY | libc::O_CLOEXEC) {
            let _ = raw::fd::write(fd.as_fd(), OOM_SCORE_ADJ_VALUE);
        }

        #[cfg(feature = "insecure-test-hooks")]
        if self.weaken.has("keep-caps") {
            return self.enter_keeping_caps();
        }

        if let Err(e) = raw::process::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        ) {
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(e);
            }
        }
        for cap in 0..64 {
            match raw::process::prctl(libc::PR_CAPBSET_READ, cap) {
                Err(_) => break, // EINVAL: past CAP_LAST_CAP
                Ok(1) => {
                    raw::process::prctl(libc::PR_CAPBSET_DROP, cap)?;
                }
                Ok(_) => {}
            }
        }
        // Where permitted (needs CAP_SETPCAP; may be locked already by an outer layer).
        let _ = raw::process::prctl(libc::PR_SET_SECUREBITS, SECUREBITS);

        raw::process::setgroups(&self.groups)?;
        raw::process::setresgid(self.gid, self.gid, self.gid)?;
        raw::process::setresuid(self.uid, self.uid, self.uid)?;
        raw::process::capset_none()?;

        self.change_dir()?;
        self.restrict()
    }

    fn change_dir(&self) -> io::Result<()> {
        if let Some(cwd) = &self.cwd {
            raw::process::fchdir(cwd.as_fd())?;
            // The handle has done its job; the program must not inherit it. This closes
            // the child's copy (after fork); nothing uses it again in this process.
            raw::fd::close(cwd.as_raw_fd());
        }
        Ok(())
    }

    /// Closes every fd ≥ 3 but the child's own and `keep`. Raw calls, no allocation.
    pub(crate) fn close_fds(&self, keep: &[RawFd]) -> io::Result<()> {
        let own = [
            self.cwd.as_ref().map(|f| f.as_raw_fd()),
            self.cgroup_procs.as_ref().map(|f| f.as_raw_fd()),
            self.landlock.as_ref().map(|r| r.raw_fd()),
        ];
        // The smallest kept fd at or above `lo`, repeatedly: the gaps between are closed.
        let mut lo: RawFd = 3;
        loop {
            let next = own
                .iter()
                .flatten()
                .chain(keep.iter())
                .copied()
                .filter(|&fd| fd >= lo)
                .min();
            let hi = match next {
                Some(fd) => fd - 1,
                None => RawFd::MAX,
            };
            if hi >= lo {
                // Closes descriptors nothing in the child uses (every one it needs is kept).
                raw::fd::close_range(lo as u32, hi as u32, 0)?;
            }
            match next {
                Some(fd) if fd < RawFd::MAX => lo = fd + 1,
                _ => return Ok(()),
            }
        }
    }

    /// no_new_privs, Landlock, seccomp.
    fn restrict(&self) -> io::Result<()> {
        #[cfg(feature = "insecure-test-hooks")]
        let nnp = !self.weaken.has("suid");
        #[cfg(not(feature = "insecure-test-hooks"))]
        let nnp = true;
        if nnp {
            raw::process::prctl(libc::PR_SET_NO_NEW_PRIVS, 1)?;
        }
        #[cfg(feature = "insecure-test-hooks")]
        let landlock = if self.weaken.has("no-landlock") {
            None
        } else {
            self.landlock.as_ref()
        };
        #[cfg(not(feature = "insecure-test-hooks"))]
        let landlock = self.landlock.as_ref();
        if let Some(rs) = landlock {
            rs.restrict_self()?;
        }
        #[cfg(feature = "insecure-test-hooks")]
        if self.weaken.has("no-seccomp") {
            return Ok(());
        }
        crate::seccomp::apply(&self.seccomp)
    }

    /// Test-only: ids are still set, but no capability is dropped.
    #[cfg(feature = "insecure-test-hooks")]
    fn enter_keeping_caps(&self) -> io::Result<()> {
        // KEEP_CAPS keeps the permitted set across setresuid.
        let _ = raw::process::prctl(libc::PR_SET_KEEPCAPS, 1);
        raw::process::setgroups(&self.groups)?;
        raw::process::setresgid(self.gid, self.gid, self.gid)?;
        raw::process::setresuid(self.uid, self.uid, self.uid)?;
        self.change_dir()?;
        self.restrict()
    }
}
