//! The mount plan of a sandbox's root filesystem ([`build_root`]), written against the
//! [`Syscall`] trait: [`Host`] makes the real calls (through `crate::raw`), and the tests
//! below record them and check the plan without root — order, flags (nosuid, nodev,
//! noexec), read-only remounts, masked `/proc` paths (youki's `syscall/` pattern).
//!
//! The trait holds the calls of the plan, nothing else: the rest of the sandbox's init
//! (namespaces, pivot, ids) is in `init.rs`.

use super::{disk, weakened, JailSpec};
use crate::raw;
use crate::{Result, SysError};
use std::fs;
use std::path::{Path, PathBuf};

/// What a path names, as far as the plan cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    Other,
}

/// The system calls and file operations of the mount plan.
pub trait Syscall {
    /// `mount(2)`; `fstype` `None` is a bind or remount.
    fn mount(
        &self,
        src: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: libc::c_ulong,
        data: Option<&str>,
    ) -> Result<()>;
    /// `mkdir -p`.
    fn mkdir_all(&self, path: &Path) -> Result<()>;
    /// Creates an empty file (a bind mount target).
    fn create_file(&self, path: &Path) -> Result<()>;
    fn symlink(&self, target: &Path, link: &Path) -> std::io::Result<()>;
    fn chdir(&self, path: &Path) -> Result<()>;
    /// What is at `path` (following a symlink when `follow`), `None` when nothing is.
    fn kind(&self, path: &Path, follow: bool) -> Option<Kind>;
    /// Whether `path` itself is a symbolic link.
    fn is_symlink(&self, path: &Path) -> bool;
    /// Attaches a disk image to a loop device: the device path, and a handle that keeps
    /// it until the caller has mounted it.
    fn attach_loop(&self, image: &Path) -> Result<(Option<std::os::fd::OwnedFd>, PathBuf)>;
    fn remove_dir_all(&self, path: &Path) -> Result<()>;
    fn chown(&self, path: &Path, id: u32) -> std::io::Result<()>;
    fn chmod(&self, path: &Path, mode: u32) -> std::io::Result<()>;
    /// Best effort: fills the directory `reserve` with placeholder files.
    fn fill_inode_reserve(&self, reserve: &Path, count: usize);
    /// Stacks an idmapped copy of the mount at `target` on it (the user namespace fd).
    fn idmap_mount(&self, target: &Path, userns_fd: i32) -> Result<()>;
    /// Stacks a read-only idmapped copy of the layer directory `target` on it.
    fn idmap_lower(&self, target: &Path, userns_fd: i32) -> Result<()>;
}

/// The real calls.
#[derive(Debug, Clone, Copy)]
pub struct Host;

impl Syscall for Host {
    fn mount(
        &self,
        src: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: libc::c_ulong,
        data: Option<&str>,
    ) -> Result<()> {
        let src_c = src.map(super::cstr).transpose()?;
        let target_c = super::cstr(target)?;
        let fstype_c = fstype.map(super::cstr).transpose()?;
        let data_c = data.map(super::cstr).transpose()?;
        raw::mount::mount(
            src_c.as_deref(),
            &target_c,
            fstype_c.as_deref(),
            flags,
            data_c.as_deref(),
        )
        .map_err(|e| {
            SysError::os(
                format!("mount {} ({})", target.display(), fstype.unwrap_or("bind")),
                e,
            )
        })
    }

    fn mkdir_all(&self, p: &Path) -> Result<()> {
        fs::create_dir_all(p).map_err(|e| SysError::os(format!("mkdir {}", p.display()), e))
    }

    fn create_file(&self, p: &Path) -> Result<()> {
        fs::write(p, b"").map_err(|e| SysError::os(format!("create {}", p.display()), e))
    }

    fn symlink(&self, target: &Path, link: &Path) -> std::io::Result<()> {
        std::os::unix::fs::symlink(target, link)
    }

    fn chdir(&self, p: &Path) -> Result<()> {
        std::env::set_current_dir(p).map_err(|e| SysError::os(format!("chdir {}", p.display()), e))
    }

    fn kind(&self, p: &Path, follow: bool) -> Option<Kind> {
        let meta = if follow {
            fs::metadata(p)
        } else {
            fs::symlink_metadata(p)
        };
        meta.ok()
            .map(|m| if m.is_dir() { Kind::Dir } else { Kind::Other })
    }

    fn is_symlink(&self, p: &Path) -> bool {
        fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
    }

    fn attach_loop(&self, image: &Path) -> Result<(Option<std::os::fd::OwnedFd>, PathBuf)> {
        disk::attach_loop(image).map(|(fd, dev)| (Some(fd), dev))
    }

    fn remove_dir_all(&self, p: &Path) -> Result<()> {
        fs::remove_dir_all(p).map_err(|e| SysError::os(format!("clear {}", p.display()), e))
    }

    fn chown(&self, p: &Path, id: u32) -> std::io::Result<()> {
        std::os::unix::fs::chown(p, Some(id), Some(id))
    }

    fn chmod(&self, p: &Path, mode: u32) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(p, fs::Permissions::from_mode(mode))
    }

    fn idmap_mount(&self, target: &Path, userns_fd: i32) -> Result<()> {
        // The launch helper's handle on the idmap's user namespace, inherited over the
        // fork and open until the agent's exec closes it (O_CLOEXEC).
        raw::fd::with_borrowed(userns_fd, |ns| disk::idmap_mount(target, ns))
    }

    fn idmap_lower(&self, target: &Path, userns_fd: i32) -> Result<()> {
        // The same handle's lifetime as `idmap_mount`'s (the helper's, until the exec).
        raw::fd::with_borrowed(userns_fd, |ns| disk::idmap_lower(target, ns))
    }

    fn fill_inode_reserve(&self, reserve: &Path, count: usize) {
        if fs::create_dir_all(reserve).is_err() {
            return;
        }
        for i in 0..count {
            if fs::write(reserve.join(i.to_string()), b"").is_err() {
                return;
            }
        }
    }
}

/// Paths under `/proc` hidden behind `/dev/null` or an empty read-only tmpfs.
const MASKED_PROC: &[&str] = &[
    "kcore",
    "keys",
    "key-users",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
    "sysrq-trigger",
    "acpi",
    "scsi",
    "asound",
    "firmware",
    "interrupts",
    "kallsyms",
    "modules",
    "vmallocinfo",
    "buddyinfo",
    "pagetypeinfo",
    "zoneinfo",
    "slabinfo",
    "mtrr",
];
/// Paths under `/proc` made read-only.
const READONLY_PROC: &[&str] = &[
    "sys", "irq", "bus", "fs", "sysvipc", "driver", "tty", "pressure",
];
/// Device nodes bound from the host into the sandbox's `/dev`.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Bind-mounts `src` on `target` read-only, nosuid, nodev.
fn bind_ro(sys: &impl Syscall, src: &Path, target: &Path) -> Result<()> {
    sys.mount(Some(src), target, None, libc::MS_BIND | libc::MS_REC, None)?;
    sys.mount(
        None,
        target,
        None,
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
        None,
    )
}

/// `target` under `root` if every directory on the way is a real directory (no symlink)
/// and it exists and is not a directory. The upper layer belongs to the sandbox: a symlink
/// in it resolved now, as host root before the pivot, would point at the host.
fn existing_file(sys: &impl Syscall, root: &Path, target: &Path) -> Option<PathBuf> {
    let mut p = root.to_path_buf();
    let parts: Vec<_> = target
        .components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .collect();
    let (last, dirs) = parts.split_last()?;
    for c in dirs {
        p.push(c);
        if sys.kind(&p, false) != Some(Kind::Dir) {
            return None;
        }
    }
    p.push(last);
    // Not a symlink either: one to an existing file would be resolved against the host.
    (sys.kind(&p, false) == Some(Kind::Other) && !sys.is_symlink(&p)).then_some(p)
}

fn inside(root: &Path, p: &Path) -> PathBuf {
    root.join(p.strip_prefix("/").unwrap_or(p))
}

/// Mounts the sandbox's disk image on the parent of `upper` (in this, the sandbox's, mount
/// namespace) and prepares upper/work inside it.
fn mount_disk(sys: &impl Syscall, image: &Path, spec: &JailSpec) -> Result<()> {
    let target = spec
        .upper
        .parent()
        .ok_or_else(|| SysError::Other("upper has no parent".into()))?;
    let (loopfd, dev) = sys.attach_loop(image)?;
    sys.mount(
        Some(&dev),
        target,
        Some("ext4"),
        libc::MS_NOSUID | libc::MS_NODEV,
        // No flushes during the boot; the daemon turns them back on (ADR 0216).
        Some(super::disk::BOOT_DISK_OPTIONS),
    )?;
    // The mount holds the device now; autoclear detaches it when the mount goes away.
    drop(loopfd);
    // Inodes held back for this boot: ext4 reserves blocks for root but no inodes, and
    // overlayfs needs a few in its workdir at mount time, even when the sandbox has
    // used up every other inode. Refilled by `refill_inode_reserve` after the mount.
    let reserve = target.join(INODE_RESERVE_DIR);
    if sys.kind(&reserve, true) == Some(Kind::Dir) {
        sys.remove_dir_all(&reserve)?;
    }
    // A previous agent's workdir may hold leftovers overlayfs refuses to reuse.
    if sys.kind(&spec.work, true).is_some() {
        sys.remove_dir_all(&spec.work)?;
    }
    sys.mkdir_all(&spec.work)?;
    if sys.kind(&spec.upper, true).is_none() {
        let home = spec.upper.join("home/user");
        sys.mkdir_all(&home)?;
        // Written on the disk as it is stored: in its owners' range when idmapped.
        let owner = match spec.disk_owner_base {
            Some(base) => spec
                .home_owner
                .wrapping_sub(spec.id_base)
                .wrapping_add(base),
            None => spec.home_owner,
        };
        sys.chown(&home, owner)
            .map_err(|e| SysError::os("chown home/user", e))?;
        sys.chmod(&home, 0o755)
            .map_err(|e| SysError::os("chmod home/user", e))?;
    }
    // A disk whose owners are another range's (a fork's clone): seen through an idmap,
    // so nothing on it is rewritten (ADR 0100's walk is gone).
    if let Some(fd) = spec.disk_userns_fd {
        sys.idmap_mount(target, fd)?;
    }
    Ok(())
}

/// Directory in the root of a sandbox's disk image (outside upper/work, so invisible
/// inside) holding placeholder files whose inodes the next boot may use.
const INODE_RESERVE_DIR: &str = "inode-reserve";
const INODE_RESERVE: usize = 32;

/// Best effort: takes back up to [`INODE_RESERVE`] inodes for the next boot.
fn refill_inode_reserve(sys: &impl Syscall, spec: &JailSpec) {
    if let Some(disk) = spec.upper.parent() {
        sys.fill_inode_reserve(&disk.join(INODE_RESERVE_DIR), INODE_RESERVE);
    }
}

/// The gvisor launch helper's half of the same reserve (`crate::gvisor`): frees the
/// inodes held in `disk` (the root of a mounted disk image) before the overlay's workdir
/// is made again.
pub(crate) fn release_inode_reserve(disk: &Path) -> Result<()> {
    let reserve = disk.join(INODE_RESERVE_DIR);
    if Host.kind(&reserve, true) == Some(Kind::Dir) {
        Host.remove_dir_all(&reserve)?;
    }
    Ok(())
}

/// Best effort, after the overlay is mounted: holds [`INODE_RESERVE`] inodes of `disk`
/// back for the next boot (the gvisor launch helper's [`refill_inode_reserve`]).
pub(crate) fn refill_inode_reserve_at(disk: &Path) {
    Host.fill_inode_reserve(&disk.join(INODE_RESERVE_DIR), INODE_RESERVE);
}

/// `target` as a path relative to `base` (both absolute), using `..` where needed.
pub(crate) fn relative_to(base: &Path, target: &Path) -> PathBuf {
    let b: Vec<_> = base.components().collect();
    let t: Vec<_> = target.components().collect();
    let common = b.iter().zip(&t).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c);
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

pub(crate) fn build_root(sys: &impl Syscall, spec: &JailSpec) -> Result<()> {
    let root = &spec.rootfs;
    // Nothing we mount here may propagate back to the host.
    sys.mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;

    if let Some(image) = &spec.disk_image {
        mount_disk(sys, image, spec)?;
    }

    // An OCI image's layers hold the image's own ids (ADR 0175): each is seen through an
    // idmap onto this sandbox's range, read-only, in this mount namespace only. Once per
    // directory: an image may list one layer twice (two empty layers share a diff_id),
    // and an idmapped mount cannot be idmapped again.
    if spec.lower_idmap {
        let fd = spec.lower_userns_fd.ok_or_else(|| {
            SysError::Other("the idmap of the image's layers was not made".into())
        })?;
        let mut done: Vec<&Path> = Vec::with_capacity(spec.lower.len());
        for l in &spec.lower {
            if !done.contains(&l.as_path()) {
                sys.idmap_lower(l, fd)?;
                done.push(l);
            }
        }
    }

    // The options are mounted relative to the sandbox's directory: overlayfs shows them
    // verbatim in /proc/self/mountinfo, which must not reveal host paths.
    let base = spec.upper.parent().unwrap_or(Path::new("/"));
    sys.chdir(base)?;
    let lower = spec
        .lower
        .iter()
        .map(|p| relative_to(base, p).display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower,
        relative_to(base, &spec.upper).display(),
        relative_to(base, &spec.work).display()
    );
    let overlay_flags = if weakened(spec, "suid") {
        libc::MS_NODEV
    } else {
        libc::MS_NOSUID | libc::MS_NODEV
    };
    sys.mount(
        Some(Path::new("overlay")),
        root,
        Some("overlay"),
        overlay_flags,
        Some(&opts),
    )?;
    if spec.disk_image.is_some() {
        refill_inode_reserve(sys, spec);
    }

    for b in &spec.binds {
        let t = inside(root, &b.target);
        if sys.kind(&b.source, true) == Some(Kind::Dir) {
            sys.mkdir_all(&t)?;
        } else if sys.kind(&t, true).is_none() {
            if let Some(parent) = t.parent() {
                sys.mkdir_all(parent)?;
            }
            sys.create_file(&t)?;
        }
        bind_ro(sys, &b.source, &t)?;
    }

    for b in &spec.file_binds {
        if let Some(t) = existing_file(sys, root, &b.target) {
            bind_ro(sys, &b.source, &t)?;
        }
    }

    // /proc, fresh for the new PID namespace, with the dangerous parts masked.
    let proc_dir = root.join("proc");
    sys.mkdir_all(&proc_dir)?;
    sys.mount(
        Some(Path::new("proc")),
        &proc_dir,
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )?;
    let mask_proc = !weakened(spec, "no-proc-mask");
    for name in READONLY_PROC.iter().filter(|_| mask_proc) {
        let p = proc_dir.join(name);
        if sys.kind(&p, true).is_some() {
            bind_ro(sys, &p, &p)?;
        }
    }
    for name in MASKED_PROC.iter().filter(|_| mask_proc) {
        let p = proc_dir.join(name);
        match sys.kind(&p, false) {
            Some(Kind::Dir) => sys.mount(
                Some(Path::new("tmpfs")),
                &p,
                Some("tmpfs"),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                Some("size=0,mode=555"),
            )?,
            Some(Kind::Other) => {
                sys.mount(Some(Path::new("/dev/null")), &p, None, libc::MS_BIND, None)?
            }
            None => {}
        }
    }

    // A minimal /dev.
    let dev = root.join("dev");
    sys.mkdir_all(&dev)?;
    sys.mount(
        Some(Path::new("tmpfs")),
        &dev,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("size=64k,mode=755"),
    )?;
    for d in DEVICES {
        let t = dev.join(d);
        sys.create_file(&t)?;
        sys.mount(
            Some(&Path::new("/dev").join(d)),
            &t,
            None,
            libc::MS_BIND,
            None,
        )?;
        sys.mount(
            None,
            &t,
            None,
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NOEXEC,
            None,
        )?;
    }
    let pts = dev.join("pts");
    sys.mkdir_all(&pts)?;
    let pts_opts = format!(
        "newinstance,ptmxmode=0666,mode=0620,gid={}",
        spec.id_base + 5
    );
    sys.mount(
        Some(Path::new("devpts")),
        &pts,
        Some("devpts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some(&pts_opts),
    )?;
    let shm = dev.join("shm");
    sys.mkdir_all(&shm)?;
    let shm_opts = format!("size={},mode=1777", spec.tmpfs_bytes);
    sys.mount(
        Some(Path::new("tmpfs")),
        &shm,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some(&shm_opts),
    )?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        sys.symlink(Path::new(target), &dev.join(link))
            .map_err(|e| SysError::os(format!("symlink /dev/{link}"), e))?;
    }
    sys.mount(
        None,
        &dev,
        None,
        libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("size=64k,mode=755"),
    )?;

    if weakened(spec, "host-dev") {
        sys.mount(
            Some(Path::new("/dev")),
            &dev,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )?;
    }
    if weakened(spec, "bind-host-tmp") {
        let t = root.join("host-tmp");
        sys.mkdir_all(&t)?;
        sys.mount(
            Some(Path::new("/tmp")),
            &t,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )?;
    }

    // /tmp: writable, charged to the sandbox's memory limit.
    let tmp = root.join("tmp");
    sys.mkdir_all(&tmp)?;
    let tmp_opts = format!("size={},mode=1777", spec.tmpfs_bytes);
    sys.mount(
        Some(Path::new("tmpfs")),
        &tmp,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&tmp_opts),
    )?;
    Ok(())
}

#[cfg(test)]
#[path = "rootfs_tests.rs"]
pub(crate) mod tests;
