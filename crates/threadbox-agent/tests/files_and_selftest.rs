//! The file API (as the requesting user, with the path refusals) and the selftest.

mod common;

use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;
use threadbox_proto::*;

fn write(c: &mut Client, path: &str, data: &[u8], append: bool, user: RunAs) -> Response {
    c.call(Request::FileWrite {
        path: path.into(),
        user,
        data: data.to_vec(),
        append,
        mode: None,
        make_parents: true,
    })
}

fn read(c: &mut Client, path: &str, offset: u64, limit: Option<u64>) -> Response {
    c.call(Request::FileRead {
        path: path.into(),
        user: RunAs::User,
        offset,
        limit,
    })
}

fn kind(r: Response) -> ErrorKind {
    match r {
        Response::Error { kind, .. } => kind,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn write_read_stat_list_mkdir_rename_remove() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let dir = Scratch::new();
    let f = dir.path("sub/deeper/data.bin");
    let payload: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    assert_eq!(
        write(&mut c, &f, &payload[..100_000], false, RunAs::User),
        Response::Done
    );
    assert_eq!(
        write(&mut c, &f, &payload[100_000..], true, RunAs::User),
        Response::Done
    );
    // Owned by the user, with the default mode, in directories the user created.
    let meta = std::fs::metadata(&f).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (1000, 1000, 0o644)
    );
    assert_eq!(std::fs::metadata(dir.path("sub")).unwrap().uid(), 1000);
    assert_eq!(std::fs::read(&f).unwrap(), payload);

    match read(&mut c, &f, 0, None) {
        Response::FileData { data, eof, size } => {
            assert_eq!(data, payload);
            assert!(eof);
            assert_eq!(size, 300_000);
        }
        other => panic!("{other:?}"),
    }
    match read(&mut c, &f, 1000, Some(10)) {
        Response::FileData { data, eof, .. } => {
            assert_eq!(data, &payload[1000..1010]);
            assert!(!eof);
        }
        other => panic!("{other:?}"),
    }
    // Overwrite truncates.
    assert_eq!(
        write(&mut c, &f, b"short", false, RunAs::User),
        Response::Done
    );
    assert_eq!(std::fs::read(&f).unwrap(), b"short");
    // An explicit mode is applied exactly (umask does not interfere), setuid bits dropped.
    let exe = dir.path("run.sh");
    assert_eq!(
        c.call(Request::FileWrite {
            path: exe.clone().into(),
            user: RunAs::User,
            data: b"#!/bin/sh\n".to_vec(),
            append: false,
            mode: Some(0o4777),
            make_parents: false
        }),
        Response::Done
    );
    assert_eq!(std::fs::metadata(&exe).unwrap().mode() & 0o7777, 0o777);

    std::os::unix::fs::symlink("sub", dir.0.join("link")).unwrap();
    // The scratch dir is sticky (1777): the user may remove only what the user owns.
    std::os::unix::fs::lchown(dir.0.join("link"), Some(1000), Some(1000)).unwrap();
    match c.call(Request::FileStat {
        path: dir.path("link").into(),
        user: RunAs::User,
    }) {
        Response::FileStat(i) => {
            assert_eq!(i.kind, FileKind::Symlink);
            assert_eq!(i.symlink_target.as_deref(), Some("sub"));
        }
        other => panic!("{other:?}"),
    }
    match c.call(Request::FileList {
        path: dir.0.to_string_lossy().into(),
        user: RunAs::User,
    }) {
        Response::FileList { entries } => {
            let names: Vec<(&str, &FileKind)> = entries
                .iter()
                .map(|e| (e.name.to_str().unwrap(), &e.kind))
                .collect();
            assert_eq!(
                names,
                vec![
                    ("link", &FileKind::Symlink),
                    ("run.sh", &FileKind::File),
                    ("sub", &FileKind::Dir)
                ]
            );
            assert_eq!(entries[2].path, dir.path("sub"));
        }
        other => panic!("{other:?}"),
    }

    assert_eq!(
        c.call(Request::Mkdir {
            path: dir.path("a/b/c").into(),
            user: RunAs::User,
            parents: true
        }),
        Response::Done
    );
    assert_eq!(
        kind(c.call(Request::Mkdir {
            path: dir.path("a").into(),
            user: RunAs::User,
            parents: false
        })),
        ErrorKind::AlreadyExists
    );
    assert_eq!(
        kind(c.call(Request::Mkdir {
            path: dir.path("x/y").into(),
            user: RunAs::User,
            parents: false
        })),
        ErrorKind::NotFound
    );

    assert_eq!(
        c.call(Request::Rename {
            from: exe.clone().into(),
            to: dir.path("a/moved.sh").into(),
            user: RunAs::User
        }),
        Response::Done
    );
    assert!(std::path::Path::new(&dir.path("a/moved.sh")).exists());

    assert_eq!(
        kind(c.call(Request::Remove {
            path: dir.path("a").into(),
            user: RunAs::User,
            recursive: false
        })),
        ErrorKind::InvalidArgument
    );
    // Removing the symlink removes the link, not its target.
    assert_eq!(
        c.call(Request::Remove {
            path: dir.path("link").into(),
            user: RunAs::User,
            recursive: false
        }),
        Response::Done
    );
    assert!(std::path::Path::new(&dir.path("sub/deeper/data.bin")).exists());
    assert_eq!(
        c.call(Request::Remove {
            path: dir.path("a").into(),
            user: RunAs::User,
            recursive: true
        }),
        Response::Done
    );
    assert!(!std::path::Path::new(&dir.path("a")).exists());
    assert_eq!(
        kind(read(&mut c, &dir.path("a/moved.sh"), 0, None)),
        ErrorKind::NotFound
    );
    assert_eq!(
        kind(read(&mut c, &dir.path("sub"), 0, None)),
        ErrorKind::IsADirectory
    );
    assert_eq!(
        kind(c.call(Request::FileList {
            path: f.clone().into(),
            user: RunAs::User
        })),
        ErrorKind::NotADirectory
    );
}

#[test]
fn reads_are_capped_at_4_mib() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let dir = Scratch::new();
    let f = dir.path("big");
    std::fs::write(&f, vec![7u8; 5 << 20]).unwrap();
    match read(&mut c, &f, 0, Some(100 << 20)) {
        Response::FileData { data, eof, size } => {
            assert_eq!(data.len(), 4 << 20);
            assert!(!eof);
            assert_eq!(size, 5 << 20);
        }
        other => panic!("{other:?}"),
    }
    match read(&mut c, &f, 4 << 20, None) {
        Response::FileData { data, eof, .. } => {
            assert_eq!(data.len(), 1 << 20);
            assert!(eof);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn permissions_are_those_of_the_user() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let dir = Scratch::new();
    let secret = dir.path("root-only");
    std::fs::write(&secret, b"secret").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        kind(read(&mut c, &secret, 0, None)),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        kind(write(&mut c, &secret, b"x", false, RunAs::User)),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        kind(c.call(Request::Remove {
            path: "/etc/hostname".into(),
            user: RunAs::User,
            recursive: false
        })),
        ErrorKind::PermissionDenied
    );
    // As root the same file is readable, and a file root writes belongs to root.
    match c.call(Request::FileRead {
        path: secret.clone().into(),
        user: RunAs::Root,
        offset: 0,
        limit: None,
    }) {
        Response::FileData { data, .. } => assert_eq!(data, b"secret"),
        other => panic!("{other:?}"),
    }
    let rf = dir.path("by-root");
    assert_eq!(write(&mut c, &rf, b"r", false, RunAs::Root), Response::Done);
    assert_eq!(std::fs::metadata(&rf).unwrap().uid(), 0);
    // The agent's own identity is restored after each operation: a later user write still
    // produces a user-owned file.
    let uf = dir.path("by-user");
    assert_eq!(write(&mut c, &uf, b"u", false, RunAs::User), Response::Done);
    assert_eq!(std::fs::metadata(&uf).unwrap().uid(), 1000);
}

#[test]
fn kernel_interfaces_and_bad_paths_are_refused() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let dir = Scratch::new();
    for p in [
        "/proc/self/status",
        "/proc/../proc/1/environ",
        "/sys/kernel/uevent_helper",
        "/dev/null",
    ] {
        assert_eq!(
            kind(read(&mut c, p, 0, None)),
            ErrorKind::PermissionDenied,
            "{p}"
        );
        assert_eq!(
            kind(write(&mut c, p, b"x", false, RunAs::Root)),
            ErrorKind::PermissionDenied,
            "{p}"
        );
    }
    assert_eq!(
        kind(c.call(Request::FileList {
            path: "/proc".into(),
            user: RunAs::Root
        })),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        kind(read(&mut c, "/tmp/a\0b", 0, None)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(read(&mut c, &format!("/{}", "a".repeat(5000)), 0, None)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(c.call(Request::Remove {
            path: "/".into(),
            user: RunAs::Root,
            recursive: true
        })),
        ErrorKind::InvalidArgument
    );

    // A planted symlink towards /proc is caught after opening (procfs), and a magic link
    // (/proc/self/fd/N) is not followed at all.
    let link = dir.0.join("to-proc");
    std::os::unix::fs::symlink("/proc/self/status", &link).unwrap();
    assert_eq!(
        kind(read(&mut c, link.to_str().unwrap(), 0, None)),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        kind(write(
            &mut c,
            link.to_str().unwrap(),
            b"x",
            false,
            RunAs::Root
        )),
        ErrorKind::PermissionDenied
    );
    let magic = dir.0.join("magic");
    std::os::unix::fs::symlink("/proc/self/fd/0", &magic).unwrap();
    let r = c.call(Request::FileRead {
        path: magic.to_string_lossy().into(),
        user: RunAs::Root,
        offset: 0,
        limit: None,
    });
    match r {
        Response::Error {
            kind: ErrorKind::InvalidArgument,
            message,
        } => assert!(message.contains("magic link"), "{message}"),
        other => panic!("{other:?}"),
    }
    let dev = dir.0.join("to-dev");
    std::os::unix::fs::symlink("/dev/zero", &dev).unwrap();
    assert_eq!(
        kind(read(&mut c, dev.to_str().unwrap(), 0, None)),
        ErrorKind::InvalidArgument
    );

    // A FIFO is refused instead of blocking the agent.
    let fifo = dir.path("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    std::fs::set_permissions(&fifo, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(
        kind(read(&mut c, &fifo, 0, None)),
        ErrorKind::InvalidArgument
    );
    assert!(matches!(
        kind(write(&mut c, &fifo, b"x", false, RunAs::User)),
        ErrorKind::InvalidArgument | ErrorKind::Internal
    ));
    assert_eq!(c.call(Request::Ping), Response::Pong);
}

#[test]
fn relative_paths_are_under_home() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    // /root exists on the host: a relative path for root resolves there.
    match c.call(Request::FileStat {
        path: ".".into(),
        user: RunAs::Root,
    }) {
        Response::FileStat(i) => assert_eq!(i.path, "/root"),
        other => panic!("{other:?}"),
    }
    match c.call(Request::FileStat {
        path: "../../..".into(),
        user: RunAs::Root,
    }) {
        Response::FileStat(i) => assert_eq!(i.path, "/"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn selftest_reports_the_child_posture() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let checks = match c.call(Request::Selftest) {
        Response::Selftest { checks } => checks,
        other => panic!("{other:?}"),
    };
    let get = |n: &str| {
        checks
            .iter()
            .find(|c| c.name == n)
            .unwrap_or_else(|| panic!("no check {n}: {checks:#?}"))
    };
    for c in &checks {
        assert!(!c.detail.is_empty() && !c.detail.contains('\n'), "{c:?}");
    }
    // What holds on the host too: the child policy itself.
    for n in [
        "seccomp",
        "no_new_privs",
        "capabilities",
        "user",
        "unshare_refused",
        "mount_refused",
        "kernel_files_read_only",
        "landlock",
    ] {
        assert!(get(n).ok, "{:?}", get(n));
    }
    // What only the jail provides fails here, which shows those checks can fail:
    // the host's uid map is the identity (0 -> 0), pid 1 is not the agent.
    assert!(!get("uid_map").ok, "{:?}", get("uid_map"));
    assert!(!get("pid_namespace").ok && !get("agent_is_pid1").ok);
    for n in [
        "network_interfaces",
        "no_routes",
        "egress_blocked",
        "dev_entries",
        "hostname",
    ] {
        get(n);
    }
    // The selftest child was reaped.
    assert!(wait_until(Duration::from_secs(5), || {
        let s = std::fs::read_to_string(format!(
            "/proc/{}/task/{}/children",
            agent.pid(),
            agent.pid()
        ))
        .unwrap_or_default();
        s.trim().is_empty()
    }));
}

/// F8: the agent has one thread, so a long recursive remove must not hold it. While the
/// remove of a large tree is in flight, an exec sent after it on the same connection
/// finishes first (an order of completion, not a time).
#[test]
fn a_recursive_remove_does_not_stall_a_concurrent_exec() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let dir = Scratch::new();
    let tree = dir.0.join("tree");
    // 60 directories of 1,000 empty files, one of them nested deeper: far more work than
    // starting `/bin/true`, whatever the machine's load.
    for d in 0..60 {
        let sub = if d == 0 {
            tree.join("d0").join("deeper").join("still")
        } else {
            tree.join(format!("d{d}"))
        };
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..1000 {
            std::fs::File::create(sub.join(format!("f{f}"))).unwrap();
        }
    }
    let rm = c.send(Request::Remove {
        path: tree.to_string_lossy().into(),
        user: RunAs::Root,
        recursive: true,
    });
    let ex = c.send(Request::Exec(argv(&["/bin/true"])));
    let mut finished = Vec::new();
    while finished.len() < 2 {
        match c.recv() {
            Frame::Response { id, resp } if resp.is_final() => finished.push((id, resp)),
            Frame::Response { .. } => {}
            other => panic!("unexpected frame {other:?}"),
        }
    }
    let ids: Vec<u64> = finished.iter().map(|(id, _)| *id).collect();
    assert_eq!(
        ids,
        vec![ex, rm],
        "the exec must finish while the remove is still running: {finished:?}"
    );
    for (id, resp) in &finished {
        if *id == rm {
            assert!(matches!(resp, Response::Done), "{resp:?}");
        } else {
            assert!(
                matches!(resp, Response::Exited(r) if r.exit_code == Some(0)),
                "{resp:?}"
            );
        }
    }
    assert!(!tree.exists(), "the tree is removed");
}

#[test]
fn names_that_are_not_utf8_cross_as_bytes() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let dir = Scratch::new();
    let mut raw = dir.path("").into_bytes();
    if !raw.ends_with(b"/") {
        raw.push(b'/');
    }
    raw.extend_from_slice(b"caf\xe9-\xff.txt");
    let path = PathBytes(raw.clone());
    let r = c.call(Request::FileWrite {
        path: path.clone(),
        user: RunAs::User,
        data: b"bonjour".to_vec(),
        append: false,
        mode: None,
        make_parents: true,
    });
    assert_eq!(r, Response::Done);
    use std::os::unix::ffi::OsStrExt;
    let on_disk = std::path::Path::new(std::ffi::OsStr::from_bytes(&raw));
    assert_eq!(std::fs::read(on_disk).unwrap(), b"bonjour");
    match c.call(Request::FileList {
        path: dir.0.to_string_lossy().into(),
        user: RunAs::User,
    }) {
        Response::FileList { entries } => {
            let e = entries
                .iter()
                .find(|e| e.name.as_bytes() == b"caf\xe9-\xff.txt")
                .unwrap_or_else(|| panic!("not listed as bytes: {entries:?}"));
            assert_eq!(e.path, path);
        }
        other => panic!("{other:?}"),
    }
    match c.call(Request::FileRead {
        path: path.clone(),
        user: RunAs::User,
        offset: 0,
        limit: None,
    }) {
        Response::FileData { data, .. } => assert_eq!(data, b"bonjour"),
        other => panic!("{other:?}"),
    }
    // The lossy form (U+FFFD) is another name, not this file.
    let r = c.call(Request::FileStat {
        path: path.lossy().into(),
        user: RunAs::User,
    });
    assert_eq!(kind(r), ErrorKind::NotFound);
}
