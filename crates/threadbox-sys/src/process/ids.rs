//! The agent's own process attributes: dumpable, subreaper, umask, groups, and the
//! temporary filesystem identity of file operations.

use crate::raw;
use std::io;
use std::marker::PhantomData;

/// PR_SET_DUMPABLE: a non-dumpable process cannot be ptraced or have its /proc files read
/// by other users (the agent is non-dumpable).
pub fn set_dumpable(on: bool) -> io::Result<()> {
    raw::process::prctl(libc::PR_SET_DUMPABLE, on as libc::c_ulong).map(drop)
}

/// Orphans of our descendants are re-parented to us (so we reap them) even when we are not
/// PID 1, as in the agent's host test mode.
pub fn set_child_subreaper() -> io::Result<()> {
    raw::process::prctl(libc::PR_SET_CHILD_SUBREAPER, 1).map(drop)
}

/// Sets the process umask.
pub fn set_umask(mask: u32) {
    raw::process::umask(mask)
}

/// Writes back every file system's dirty data (`sync(2)`): before a memory checkpoint,
/// what the sandbox wrote reaches the host's files (ADR 0130).
pub fn sync_all() {
    raw::process::sync()
}

/// Empties the supplementary group list of the calling process, so file operations done
/// under a temporary fsuid/fsgid get no group rights of ours.
pub fn clear_supplementary_groups() -> io::Result<()> {
    raw::process::setgroups(&[])
}

/// While alive, the calling thread's filesystem uid/gid are the given ones (so permission
/// checks and the owner of new files are those of that user); dropping restores them.
///
/// Not `Send`: the ids belong to the thread that set them, so the guard must be dropped
/// there.
#[derive(Debug)]
pub struct FsIdentity {
    prev_uid: libc::uid_t,
    prev_gid: libc::gid_t,
    /// The effective ids were switched instead (see [`assume_fs_identity`]).
    effective: bool,
    _thread: PhantomData<*const ()>,
}

/// Switches the filesystem identity of the calling thread (see [`FsIdentity`]).
///
/// Where the kernel keeps no separate filesystem ids (gVisor's sentry answers `setfsuid`
/// with the effective uid and changes nothing), the effective ids are switched instead,
/// keeping the saved ids to come back: the same permission checks and owners, for the
/// agent's single thread. The switch is checked either way; neither taking is EPERM.
pub fn assume_fs_identity(uid: libc::uid_t, gid: libc::gid_t) -> io::Result<FsIdentity> {
    match assume_fsids(uid, gid) {
        Err(e) if raw::process::effective_ids() != (uid, gid) => {
            assume_effective_ids(uid, gid).map_err(|_| e)
        }
        // Where `setfsuid` changes nothing (gVisor) the effective ids are the file system
        // ids: already being the asked ones is the switch (root's calls as root), and
        // there is nothing to restore.
        Err(_) => Ok(FsIdentity {
            prev_uid: uid,
            prev_gid: gid,
            effective: true,
            _thread: PhantomData,
        }),
        r => r,
    }
}

fn assume_effective_ids(uid: libc::uid_t, gid: libc::gid_t) -> io::Result<FsIdentity> {
    let (prev_uid, prev_gid) = raw::process::effective_ids();
    raw::process::setresgid(u32::MAX, gid, u32::MAX)?;
    if let Err(e) = raw::process::setresuid(u32::MAX, uid, u32::MAX) {
        let _ = raw::process::setresgid(u32::MAX, prev_gid, u32::MAX);
        return Err(e);
    }
    if raw::process::effective_ids() != (uid, gid) {
        let _ = raw::process::setresuid(u32::MAX, prev_uid, u32::MAX);
        let _ = raw::process::setresgid(u32::MAX, prev_gid, u32::MAX);
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(FsIdentity {
        prev_uid,
        prev_gid,
        effective: true,
        _thread: PhantomData,
    })
}

fn assume_fsids(uid: libc::uid_t, gid: libc::gid_t) -> io::Result<FsIdentity> {
    let prev_gid = raw::process::setfsgid(gid);
    // setfsgid(-1) fails and returns the current value: the only way to check.
    if raw::process::setfsgid(u32::MAX) != gid {
        raw::process::setfsgid(prev_gid);
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    let prev_uid = raw::process::setfsuid(uid);
    if raw::process::setfsuid(u32::MAX) != uid {
        raw::process::setfsuid(prev_uid);
        raw::process::setfsgid(prev_gid);
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(FsIdentity {
        prev_uid,
        prev_gid,
        effective: false,
        _thread: PhantomData,
    })
}

impl Drop for FsIdentity {
    fn drop(&mut self) {
        if self.effective {
            // The uid first: back at euid 0 the gid may change again.
            let _ = raw::process::setresuid(u32::MAX, self.prev_uid, u32::MAX);
            let _ = raw::process::setresgid(u32::MAX, self.prev_gid, u32::MAX);
            return;
        }
        raw::process::setfsuid(self.prev_uid);
        raw::process::setfsgid(self.prev_gid);
    }
}
