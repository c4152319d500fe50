//! The mount plan's unit tests: a recording `Syscall` and the plan it must see.

use super::*;
use std::cell::RefCell;
use std::collections::BTreeMap;

/// One recorded call of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Mount {
        src: Option<PathBuf>,
        target: PathBuf,
        fstype: Option<String>,
        flags: libc::c_ulong,
        data: Option<String>,
    },
    Mkdir(PathBuf),
    Create(PathBuf),
    Symlink(PathBuf, PathBuf),
    Chdir(PathBuf),
    AttachLoop(PathBuf),
    RemoveDirAll(PathBuf),
    Chown(PathBuf, u32),
    Chmod(PathBuf, u32),
    FillInodes(PathBuf, usize),
    IdmapMount(PathBuf, i32),
    IdmapLower(PathBuf, i32),
}

/// Records every call and answers `kind` from a small in-memory tree.
#[derive(Default)]
struct Recorder {
    calls: RefCell<Vec<Call>>,
    tree: RefCell<BTreeMap<PathBuf, Kind>>,
    /// Paths of `tree` that are symlinks.
    links: RefCell<Vec<PathBuf>>,
}

impl Recorder {
    fn with(entries: &[(&str, Kind)]) -> Recorder {
        let r = Recorder::default();
        for (p, k) in entries {
            r.tree.borrow_mut().insert(PathBuf::from(p), *k);
        }
        r
    }
    fn push(&self, c: Call) {
        self.calls.borrow_mut().push(c);
    }
    fn calls(&self) -> Vec<Call> {
        self.calls.borrow().clone()
    }
    /// The mounts on `target`, in order: (fstype, flags, data).
    fn mounts_on(&self, target: &str) -> Vec<Mounted> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Mount {
                    target: t,
                    fstype,
                    flags,
                    data,
                    ..
                } if t == Path::new(target) => Some((fstype, flags, data)),
                _ => None,
            })
            .collect()
    }
    /// Where the first mount on `target` is in the plan.
    fn first_mount_on(&self, target: &str) -> usize {
        self.index_of(|c| matches!(c, Call::Mount { target: t, .. } if *t == Path::new(target)))
    }
    fn index_of(&self, pred: impl Fn(&Call) -> bool) -> usize {
        self.calls()
            .iter()
            .position(pred)
            .expect("the plan has the call")
    }
}

impl Syscall for Recorder {
    fn mount(
        &self,
        src: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: libc::c_ulong,
        data: Option<&str>,
    ) -> Result<()> {
        self.push(Call::Mount {
            src: src.map(Path::to_path_buf),
            target: target.to_path_buf(),
            fstype: fstype.map(str::to_string),
            flags,
            data: data.map(str::to_string),
        });
        Ok(())
    }
    fn mkdir_all(&self, path: &Path) -> Result<()> {
        self.push(Call::Mkdir(path.to_path_buf()));
        self.tree.borrow_mut().insert(path.to_path_buf(), Kind::Dir);
        Ok(())
    }
    fn create_file(&self, path: &Path) -> Result<()> {
        self.push(Call::Create(path.to_path_buf()));
        self.tree
            .borrow_mut()
            .insert(path.to_path_buf(), Kind::Other);
        Ok(())
    }
    fn symlink(&self, target: &Path, link: &Path) -> std::io::Result<()> {
        self.push(Call::Symlink(target.to_path_buf(), link.to_path_buf()));
        Ok(())
    }
    fn chdir(&self, path: &Path) -> Result<()> {
        self.push(Call::Chdir(path.to_path_buf()));
        Ok(())
    }
    fn kind(&self, path: &Path, _follow: bool) -> Option<Kind> {
        self.tree.borrow().get(path).copied()
    }
    fn is_symlink(&self, path: &Path) -> bool {
        self.links.borrow().iter().any(|l| l == path)
    }
    fn idmap_mount(&self, target: &Path, userns_fd: i32) -> Result<()> {
        self.push(Call::IdmapMount(target.to_path_buf(), userns_fd));
        Ok(())
    }
    fn idmap_lower(&self, target: &Path, userns_fd: i32) -> Result<()> {
        self.push(Call::IdmapLower(target.to_path_buf(), userns_fd));
        Ok(())
    }
    fn attach_loop(&self, image: &Path) -> Result<(Option<std::os::fd::OwnedFd>, PathBuf)> {
        self.push(Call::AttachLoop(image.to_path_buf()));
        Ok((None, PathBuf::from("/dev/loop7")))
    }
    fn remove_dir_all(&self, path: &Path) -> Result<()> {
        self.push(Call::RemoveDirAll(path.to_path_buf()));
        self.tree.borrow_mut().remove(path);
        Ok(())
    }
    fn chown(&self, path: &Path, id: u32) -> std::io::Result<()> {
        self.push(Call::Chown(path.to_path_buf(), id));
        Ok(())
    }
    fn chmod(&self, path: &Path, mode: u32) -> std::io::Result<()> {
        self.push(Call::Chmod(path.to_path_buf(), mode));
        Ok(())
    }
    fn fill_inode_reserve(&self, reserve: &Path, count: usize) {
        self.push(Call::FillInodes(reserve.to_path_buf(), count));
    }
}

const ROOT: &str = "/var/lib/tb/sandboxes/x/rootfs";

/// The spec the plan tests build from (with a disk image when `disk`); also the jail's
/// serialisation test's.
pub(crate) fn spec(disk: bool) -> JailSpec {
    let dir = if disk {
        "/var/lib/tb/sandboxes/x/disk"
    } else {
        "/var/lib/tb/sandboxes/x"
    };
    JailSpec {
        hostname: "x".into(),
        id_base: 1_000_000,
        lower: vec!["/var/lib/tb/images/host".into(), "/usr".into()],
        lower_idmap: false,
        lower_userns_fd: None,
        upper: format!("{dir}/upper").into(),
        work: format!("{dir}/work").into(),
        disk_image: disk.then(|| "/var/lib/tb/sandboxes/x/disk.img".into()),
        disk_owner_base: None,
        disk_userns_fd: None,
        home_owner: 1_001_000,
        rootfs: ROOT.into(),
        binds: vec![
            Bind {
                source: "/etc/resolv.conf".into(),
                target: "/etc/resolv.conf".into(),
            },
            Bind {
                source: "/opt/tools".into(),
                target: "/opt/tools".into(),
            },
        ],
        agent_path: "/x".into(),
        agent_memfd: None,
        socket_path: "/s".into(),
        cgroup_procs: vec![],
        cgroup_dir: None,
        tmpfs_bytes: 1 << 20,
        nofile: 1024,
        allow_no_landlock: false,
        test_weaken: vec![],
        file_binds: vec![],
    }
}

use super::super::Bind;

fn host() -> Recorder {
    let p = |s: &str| format!("{ROOT}/proc/{s}");
    let (acpi, kcore, sys, bus) = (p("acpi"), p("kcore"), p("sys"), p("bus"));
    Recorder::with(&[
        ("/opt/tools", Kind::Dir),
        ("/etc/resolv.conf", Kind::Other),
        (&acpi, Kind::Dir),
        (&kcore, Kind::Other),
        (&sys, Kind::Dir),
        (&bus, Kind::Dir),
    ])
}

/// The plan for `spec(disk)` on [`host`], recorded.
fn planned(disk: bool) -> Recorder {
    let sys = host();
    build_root(&sys, &spec(disk)).unwrap();
    sys
}

/// One mount as [`Recorder::mounts_on`] shows it: (fstype, flags, data).
type Mounted = (Option<String>, libc::c_ulong, Option<String>);

/// A mount of a file system `fstype` with `data`.
fn fs(fstype: &str, flags: libc::c_ulong, data: &str) -> Mounted {
    (Some(fstype.into()), flags, Some(data.into()))
}

/// A bind mount, then its remount with `flags` (a bind cannot take them at once).
fn bind_then_remount(bind: libc::c_ulong, remount: libc::c_ulong) -> Vec<Mounted> {
    vec![
        (None, libc::MS_BIND | bind, None),
        (None, libc::MS_BIND | libc::MS_REMOUNT | remount, None),
    ]
}

const NOSUID: libc::c_ulong = libc::MS_NOSUID;
const NODEV: libc::c_ulong = libc::MS_NODEV;
const NOEXEC: libc::c_ulong = libc::MS_NOEXEC;

#[test]
fn the_plan_starts_private_and_mounts_the_overlay_nosuid_with_relative_options() {
    let sys = planned(false);
    let calls = sys.calls();
    // First: nothing propagates back to the host.
    assert_eq!(
        calls[0],
        Call::Mount {
            src: None,
            target: "/".into(),
            fstype: None,
            flags: libc::MS_REC | libc::MS_PRIVATE,
            data: None
        }
    );
    // The overlay options are relative to the sandbox's directory, which the plan
    // changes into first: no host path shows in mountinfo.
    assert_eq!(calls[1], Call::Chdir("/var/lib/tb/sandboxes/x".into()));
    let overlay = sys.mounts_on(ROOT);
    assert_eq!(overlay.len(), 1);
    let (fstype, flags, data) = &overlay[0];
    assert_eq!(fstype.as_deref(), Some("overlay"));
    assert_eq!(*flags, NOSUID | NODEV);
    assert_eq!(
        data.as_deref(),
        Some("lowerdir=../../images/host:../../../../../usr,upperdir=upper,workdir=work")
    );
}

#[test]
fn binds_are_read_only_nosuid_nodev_and_stay_under_the_root() {
    let sys = planned(false);
    for (target, is_dir) in [("/opt/tools", true), ("/etc/resolv.conf", false)] {
        let t = format!("{ROOT}{target}");
        let want = if is_dir {
            Call::Mkdir(t.clone().into())
        } else {
            Call::Create(t.clone().into())
        };
        let made = sys.index_of(|c| *c == want);
        let mounts = sys.mounts_on(&t);
        assert_eq!(
            mounts,
            bind_then_remount(libc::MS_REC, libc::MS_RDONLY | NOSUID | NODEV),
            "{target}"
        );
        let bound = sys.first_mount_on(&t);
        assert!(made < bound, "{target} is created before it is mounted on");
    }
    // Every path the plan creates or mounts on is under the root (but `/` itself).
    for c in sys.calls() {
        let p = match &c {
            Call::Mount { target, .. } if target != Path::new("/") => target,
            Call::Mkdir(p) | Call::Create(p) => p,
            Call::Symlink(_, link) => link,
            _ => continue,
        };
        assert!(p.starts_with(ROOT), "{c:?} leaves the root");
    }
}

#[test]
fn proc_is_fresh_with_its_dangerous_parts_masked_or_read_only() {
    let sys = planned(false);
    let proc_ = format!("{ROOT}/proc");
    assert_eq!(
        sys.mounts_on(&proc_),
        vec![(Some("proc".into()), NOSUID | NODEV | NOEXEC, None)]
    );
    // Read-only: the entries that exist, bound on themselves and remounted read-only.
    for name in ["sys", "bus"] {
        let p = format!("{proc_}/{name}");
        let m = sys.mounts_on(&p);
        assert_eq!(m.len(), 2, "{name}");
        assert_ne!(m[1].1 & libc::MS_RDONLY, 0, "{name} is read-only");
    }
    assert!(
        sys.mounts_on(&format!("{proc_}/irq")).is_empty(),
        "absent entries are skipped"
    );
    // Masked: a directory behind an empty read-only tmpfs, a file behind /dev/null.
    assert_eq!(
        sys.mounts_on(&format!("{proc_}/acpi")),
        vec![fs(
            "tmpfs",
            libc::MS_RDONLY | NOSUID | NODEV | NOEXEC,
            "size=0,mode=555"
        )]
    );
    let kcore = format!("{proc_}/kcore");
    assert!(sys.calls().contains(&Call::Mount {
        src: Some("/dev/null".into()),
        target: kcore.into(),
        fstype: None,
        flags: libc::MS_BIND,
        data: None
    }));
    // Masking comes after the proc mount it covers.
    let proc_at = sys.first_mount_on(&proc_);
    let mask_at = sys.first_mount_on(&format!("{proc_}/acpi"));
    assert!(proc_at < mask_at);
    for name in MASKED_PROC.iter().chain(READONLY_PROC) {
        assert!(!name.contains('/'), "{name}: one component under /proc");
    }
}

#[test]
fn dev_is_a_small_tmpfs_with_the_devices_bound_nosuid_noexec_then_read_only() {
    let sys = planned(false);
    let dev = format!("{ROOT}/dev");
    let mounts = sys.mounts_on(&dev);
    let dev_opts = "size=64k,mode=755";
    assert_eq!(
        mounts,
        vec![
            fs("tmpfs", NOSUID | NOEXEC, dev_opts),
            (
                None,
                libc::MS_REMOUNT | libc::MS_RDONLY | NOSUID | NOEXEC,
                Some(dev_opts.into())
            ),
        ]
    );
    for d in DEVICES {
        let t = format!("{dev}/{d}");
        assert_eq!(
            sys.mounts_on(&t),
            bind_then_remount(0, NOSUID | NOEXEC),
            "{d}"
        );
    }
    assert_eq!(
        sys.mounts_on(&format!("{dev}/pts")),
        vec![fs(
            "devpts",
            NOSUID | NOEXEC,
            "newinstance,ptmxmode=0666,mode=0620,gid=1000005"
        )]
    );
    assert_eq!(
        sys.mounts_on(&format!("{dev}/shm")),
        vec![fs(
            "tmpfs",
            NOSUID | NODEV | NOEXEC,
            "size=1048576,mode=1777"
        )]
    );
    // The symlinks are made before /dev turns read-only.
    let ro = sys.index_of(|c| {
        matches!(c, Call::Mount { target, flags, .. }
            if *target == Path::new(&dev) && flags & libc::MS_REMOUNT != 0)
    });
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let at =
            sys.index_of(|c| *c == Call::Symlink(target.into(), format!("{dev}/{link}").into()));
        assert!(at < ro, "{link}");
    }
}

#[test]
fn tmp_comes_last_writable_but_nosuid_nodev_and_sized() {
    let sys = planned(false);
    let last = sys.calls().last().cloned();
    assert_eq!(
        last,
        Some(Call::Mount {
            src: Some("tmpfs".into()),
            target: format!("{ROOT}/tmp").into(),
            fstype: Some("tmpfs".into()),
            flags: NOSUID | NODEV,
            data: Some("size=1048576,mode=1777".into()),
        })
    );
    // No mount of the plan is setuid-capable or device-capable, but the masked files
    // (/dev/null binds) and the devices (which are devices, remounted nosuid).
    for c in sys.calls() {
        if let Call::Mount {
            src,
            target,
            fstype: Some(fs),
            flags,
            ..
        } = &c
        {
            assert_ne!(flags & NOSUID, 0, "{c:?}");
            if fs != "tmpfs" || !target.ends_with("dev") {
                assert!(flags & NODEV != 0 || fs == "devpts", "{c:?} {src:?}");
            }
        }
    }
}

#[test]
fn a_disk_image_is_mounted_before_the_overlay_and_its_workdir_cleared() {
    let sys = host();
    {
        let mut t = sys.tree.borrow_mut();
        t.insert("/var/lib/tb/sandboxes/x/disk/work".into(), Kind::Dir);
        t.insert(
            "/var/lib/tb/sandboxes/x/disk/inode-reserve".into(),
            Kind::Dir,
        );
    }
    build_root(&sys, &spec(true)).unwrap();
    let calls = sys.calls();
    let disk = "/var/lib/tb/sandboxes/x/disk";
    assert_eq!(
        calls[1],
        Call::AttachLoop("/var/lib/tb/sandboxes/x/disk.img".into())
    );
    assert_eq!(
        calls[2],
        Call::Mount {
            src: Some("/dev/loop7".into()),
            target: disk.into(),
            fstype: Some("ext4".into()),
            flags: NOSUID | NODEV,
            // Without barriers for the boot; the daemon turns them back on (ADR 0216).
            data: Some(crate::jail::BOOT_DISK_OPTIONS.into())
        }
    );
    assert_eq!(
        calls[3],
        Call::RemoveDirAll(format!("{disk}/inode-reserve").into())
    );
    assert_eq!(calls[4], Call::RemoveDirAll(format!("{disk}/work").into()));
    assert_eq!(calls[5], Call::Mkdir(format!("{disk}/work").into()));
    // A fresh upper gets home/user owned by the sandbox user.
    let home: PathBuf = format!("{disk}/upper/home/user").into();
    assert_eq!(calls[6], Call::Mkdir(home.clone()));
    assert_eq!(calls[7], Call::Chown(home.clone(), 1_001_000));
    assert_eq!(calls[8], Call::Chmod(home, 0o755));
    assert_eq!(calls[9], Call::Chdir(disk.into()));
    let overlay =
        sys.index_of(|c| matches!(c, Call::Mount { fstype: Some(f), .. } if f == "overlay"));
    assert_eq!(
        calls[overlay + 1],
        Call::FillInodes(format!("{disk}/inode-reserve").into(), INODE_RESERVE)
    );
}

/// The CA bundle's bind (ADR 0075) lands only on an existing file reached through real
/// directories: a missing target is never created, a symlink (in the target or on the
/// way) is never followed.
#[test]
fn file_binds_land_only_on_existing_files_never_through_symlinks() {
    let bundle = "/etc/ssl/certs/ca-certificates.crt";
    let at = |p: &str| format!("{ROOT}{p}");
    let dirs = ["/etc", "/etc/ssl", "/etc/ssl/certs"].map(|d| (at(d), Kind::Dir));
    // (what, extra tree entries, the path that is a symlink, whether the bind is made)
    type FileBindCase<'a> = (&'a str, Vec<(String, Kind)>, Option<&'a str>, bool);
    let cases: [FileBindCase; 4] = [
        ("a file", vec![(at(bundle), Kind::Other)], None, true),
        ("missing", vec![], None, false),
        (
            "a symlink",
            vec![(at(bundle), Kind::Other)],
            Some(bundle),
            false,
        ),
        (
            "a symlinked parent",
            vec![(at(bundle), Kind::Other)],
            Some("/etc/ssl/certs"),
            false,
        ),
    ];
    for (what, extra, link, bound) in cases {
        let mut entries: Vec<(String, Kind)> = dirs.to_vec();
        entries.extend(extra);
        if let Some(l) = link.filter(|l| *l != bundle) {
            // The parent is a link: not a directory without following it.
            entries.retain(|(p, _)| *p != at(l));
            entries.push((at(l), Kind::Other));
        }
        let refs: Vec<(&str, Kind)> = entries.iter().map(|(p, k)| (p.as_str(), *k)).collect();
        let sys = Recorder::with(&refs);
        if let Some(l) = link {
            sys.links.borrow_mut().push(at(l).into());
        }
        let mut spec = spec(false);
        spec.binds.clear();
        spec.file_binds = vec![Bind {
            source: "/var/lib/tb/sandboxes/x/run/ca-bundle.pem".into(),
            target: bundle.into(),
        }];
        build_root(&sys, &spec).unwrap();
        let mounts = sys.mounts_on(&at(bundle));
        if bound {
            assert_eq!(
                mounts,
                bind_then_remount(libc::MS_REC, libc::MS_RDONLY | NOSUID | NODEV),
                "{what}"
            );
        } else {
            assert!(mounts.is_empty(), "{what}: {mounts:?}");
        }
        assert!(
            !sys.calls().contains(&Call::Create(at(bundle).into())),
            "{what}: a file was created"
        );
    }
}

#[test]
fn a_disk_of_another_range_is_idmapped_after_its_upper_and_before_the_overlay() {
    let sys = host();
    let mut s = spec(true);
    s.disk_owner_base = Some(3_000_000);
    s.disk_userns_fd = Some(9);
    build_root(&sys, &s).unwrap();
    let calls = sys.calls();
    let disk = PathBuf::from("/var/lib/tb/sandboxes/x/disk");
    let idmap = calls
        .iter()
        .position(|c| *c == Call::IdmapMount(disk.clone(), 9))
        .expect("the disk is idmapped");
    let overlay = calls
        .iter()
        .position(|c| matches!(c, Call::Mount { fstype: Some(f), .. } if f == "overlay"))
        .expect("an overlay");
    assert!(idmap < overlay, "{calls:?}");
    // A fresh home is written in the range the disk's owners are stored in.
    let home = disk.join("upper/home/user");
    let chown = calls
        .iter()
        .position(|c| *c == Call::Chown(home.clone(), 3_001_000))
        .expect("home owned in the stored range");
    assert!(chown < idmap);
    // Without an fd, nothing is idmapped.
    let plain = planned(true);
    assert!(!plain
        .calls()
        .iter()
        .any(|c| matches!(c, Call::IdmapMount(..))));
}

#[test]
fn an_oci_images_layers_are_idmapped_once_each_before_the_overlay_and_others_never() {
    let sys = host();
    let mut s = spec(true);
    let (top, base) = ("/var/lib/tb/oci/layers/bb", "/var/lib/tb/oci/layers/aa");
    // Two empty layers share a diff_id: the same directory twice in the stack.
    s.lower = vec![top.into(), base.into(), top.into()];
    s.lower_idmap = true;
    s.lower_userns_fd = Some(11);
    s.disk_owner_base = Some(3_000_000);
    s.disk_userns_fd = Some(9);
    build_root(&sys, &s).unwrap();
    let calls = sys.calls();
    let lowers: Vec<_> = calls
        .iter()
        .filter(|c| matches!(c, Call::IdmapLower(..)))
        .cloned()
        .collect();
    assert_eq!(
        lowers,
        vec![
            Call::IdmapLower(top.into(), 11),
            Call::IdmapLower(base.into(), 11)
        ]
    );
    let overlay = calls
        .iter()
        .position(|c| matches!(c, Call::Mount { fstype: Some(f), .. } if f == "overlay"))
        .expect("an overlay");
    let last = calls
        .iter()
        .rposition(|c| matches!(c, Call::IdmapLower(..)))
        .unwrap();
    assert!(last < overlay, "{calls:?}");
    // The disk keeps its own idmap (another namespace).
    assert!(calls.contains(&Call::IdmapMount("/var/lib/tb/sandboxes/x/disk".into(), 9)));
    // The overlay still names every lower, duplicates included, relative to the sandbox.
    let (_, _, data) = &sys.mounts_on(ROOT)[0];
    assert!(
        data.as_deref().unwrap().starts_with(
            "lowerdir=../../../oci/layers/bb:../../../oci/layers/aa:../../../oci/layers/bb,"
        ),
        "{data:?}"
    );

    // Host-root-owned lowers (the host image, `/usr`): never idmapped, fd or not.
    let sys = host();
    let mut s = spec(true);
    s.lower_userns_fd = Some(11);
    build_root(&sys, &s).unwrap();
    assert!(!sys
        .calls()
        .iter()
        .any(|c| matches!(c, Call::IdmapLower(..))));
    // Asked for but without the helper's namespace: refused before the overlay, rather
    // than a root whose layers show the host's ids.
    let sys = host();
    let mut s = spec(true);
    s.lower_idmap = true;
    assert!(build_root(&sys, &s).is_err());
    assert!(!sys
        .calls()
        .iter()
        .any(|c| matches!(c, Call::Mount { fstype: Some(f), .. } if f == "overlay")));
}
