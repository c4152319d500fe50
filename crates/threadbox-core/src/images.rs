//! Images: the read-only lower layers of sandbox root filesystems.
//!
//! `host` is built in: a small skeleton (generated `/etc`, empty mount points) plus the
//! host's `/usr` (and non-merged `/bin`, `/lib*`, `/sbin`) bind-mounted read-only, so the
//! host's `python3` and tools are there with nothing to download. Any root filesystem
//! directory (e.g. made by mmdebstrap) can be added as another image.

use crate::error::{CoreError, Result};
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use threadbox_sys::jail::Bind;

pub const HOST_IMAGE: &str = "host";
const HOST_IMAGE_VERSION: &str = "5";

/// How to assemble a sandbox root from an image.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    pub lower: Vec<PathBuf>,
    pub binds: Vec<Bind>,
    /// The lowers hold the image's own uids and gids (an OCI image's layers, ADR 0175),
    /// to be shown inside through an idmap onto the sandbox's range; `false`: they are
    /// host root's (the host image, rootfs directories) and stay so.
    pub image_owners: bool,
}

/// Top-level host directories a merged-/usr system has as symlinks into /usr.
const TOP_DIRS: &[&str] = &["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Files copied from the host's /etc into the host image (no secrets: no shadow, no
/// ssh host keys, no private TLS keys).
const ETC_FILES: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "protocols",
    "services",
    "mime.types",
    "localtime",
    "timezone",
    "os-release",
    "debian_version",
    "bash.bashrc",
    "profile",
    "inputrc",
    "ca-certificates.conf",
    "magic",
    "login.defs",
    // Debian's matplotlib reads its defaults from here and refuses to import without it.
    "matplotlibrc",
];
/// Directories copied from the host's /etc (symlinks kept as symlinks).
const ETC_DIRS: &[&str] = &[
    "ld.so.conf.d",
    "alternatives",
    "ssl",
    "python3",
    "python3.11",
    "profile.d",
    "skel",
];

/// `/etc/pip.conf` of the host image. No `user = true`: that would break `pip` inside a
/// venv the agent makes; pip picks the user site itself when site-packages is read-only.
/// No version check: it would ask an index the policy may not allow.
pub const PIP_CONF: &str =
    "# threadbox: installs go to ~/.local on the sandbox's disk (ADR 0067)\n\
[global]\n\
break-system-packages = true\n\
disable-pip-version-check = true\n";

pub fn host_image_dir(root: &Path) -> PathBuf {
    root.join("images").join(HOST_IMAGE)
}

/// Builds the host image skeleton once (atomically: built aside, then renamed).
pub fn ensure_host_image(root: &Path) -> Result<()> {
    let dir = host_image_dir(root);
    if fs::read_to_string(dir.join(".threadbox-image"))
        .ok()
        .as_deref()
        == Some(HOST_IMAGE_VERSION)
    {
        return Ok(());
    }
    let tmp = root.join("images").join(format!(".{HOST_IMAGE}.building"));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    build_host_skeleton(&tmp)?;
    fs::write(tmp.join(".threadbox-image"), HOST_IMAGE_VERSION)?;
    if dir.exists() {
        // An old skeleton may still be the lower layer of running sandboxes: keep it
        // readable under another name rather than changing it underneath them.
        let old = root
            .join("images")
            .join(format!(".{HOST_IMAGE}.old.{}", crate::store::now_ms()));
        fs::rename(&dir, &old)?;
    }
    fs::rename(&tmp, &dir)?;
    Ok(())
}

fn mode(p: &Path, m: u32) -> Result<()> {
    fs::set_permissions(p, fs::Permissions::from_mode(m))?;
    Ok(())
}

fn build_host_skeleton(dir: &Path) -> Result<()> {
    for d in [
        "usr",
        "etc",
        "home",
        "proc",
        "dev",
        "run",
        "var/lib",
        "var/cache",
        "var/log",
        "opt",
        "mnt",
        "srv",
    ] {
        fs::create_dir_all(dir.join(d))?;
    }
    for (d, m) in [("tmp", 0o1777), ("var/tmp", 0o1777), ("root", 0o700)] {
        fs::create_dir_all(dir.join(d))?;
        mode(&dir.join(d), m)?;
    }
    for name in TOP_DIRS {
        let host = Path::new("/").join(name);
        match fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                symlink(fs::read_link(&host)?, dir.join(name))?;
            }
            Ok(m) if m.is_dir() => fs::create_dir_all(dir.join(name))?,
            _ => {}
        }
    }
    // Models write `python` as often as `python3`; hosts often lack the alias, and /usr
    // is the host's (read-only), so the alias lives on the agent's PATH under /opt.
    if Path::new("/usr/bin/python3").exists() && !Path::new("/usr/bin/python").exists() {
        fs::create_dir_all(dir.join("opt/threadbox/bin"))?;
        symlink("/usr/bin/python3", dir.join("opt/threadbox/bin/python"))?;
    }
    let etc = dir.join("etc");
    fs::write(
        etc.join("passwd"),
        "root:x:0:0:root:/root:/bin/bash\n\
         user:x:1000:1000:user:/home/user:/bin/bash\n\
         nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    )?;
    fs::write(
        etc.join("group"),
        "root:x:0:\ntty:x:5:\nuser:x:1000:\nnogroup:x:65534:\n",
    )?;
    fs::write(
        etc.join("hosts"),
        "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n",
    )?;
    // DNS is the daemon's (issue 13, ADR 0065): the sandbox's fixed table sends port 53 to
    // 127.0.0.53, where the daemon answers only names the policy allows. With no policy
    // nothing listens there and a lookup fails at once (port unreachable).
    fs::write(
        etc.join("resolv.conf"),
        "# threadbox: answered by the daemon by the sandbox's network policy\n\
         nameserver 127.0.0.53\noptions timeout:2 attempts:2\n",
    )?;
    fs::write(
        etc.join("nsswitch.conf"),
        "passwd: files\ngroup: files\nhosts: files dns\n",
    )?;
    // Packages just work (issue 13, ADR 0067): the host's /usr is read-only here, so
    // pip falls back to the user's site on the persistent disk by itself; this lets it
    // past PEP 668's marker (which guards the host's packages, not this sandbox's home).
    fs::write(etc.join("pip.conf"), PIP_CONF)?;
    for f in ETC_FILES {
        let src = Path::new("/etc").join(f);
        // Follow symlinks (localtime, os-release) so the image is self-contained.
        if let Ok(bytes) = fs::read(&src) {
            fs::write(etc.join(f), bytes)?;
        }
    }
    for d in ETC_DIRS {
        let src = Path::new("/etc").join(d);
        if src.is_dir() {
            copy_tree(&src, &etc.join(d))?;
        }
    }
    Ok(())
}

/// Copies a directory tree, keeping symlinks as symlinks and skipping anything that is
/// neither a file, a directory nor a symlink, and any `private` directory (TLS keys).
fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    fs::create_dir_all(dst)?;
    for entry in fs::read_dir(src)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == "private" {
            continue;
        }
        let from = entry.path();
        let to = dst.join(&name);
        let ft = entry.file_type()?;
        if ft.is_symlink() {
            symlink(fs::read_link(&from)?, &to)?;
        } else if ft.is_dir() {
            copy_tree(&from, &to)?;
        } else if ft.is_file() {
            if let Ok(bytes) = fs::read(&from) {
                fs::write(&to, bytes)?;
                let m = entry.metadata()?.permissions().mode() & 0o755;
                mode(&to, m)?;
            }
        }
    }
    Ok(())
}

/// The spec of the host image: skeleton + read-only binds of the host's system dirs.
pub fn host_image_spec(root: &Path) -> ImageSpec {
    let mut binds = vec![Bind {
        source: "/usr".into(),
        target: "/usr".into(),
    }];
    for name in TOP_DIRS {
        let host = Path::new("/").join(name);
        if let Ok(m) = fs::symlink_metadata(&host) {
            if m.is_dir() && !m.file_type().is_symlink() {
                binds.push(Bind {
                    source: host.clone(),
                    target: host,
                });
            }
        }
    }
    ImageSpec {
        lower: vec![host_image_dir(root)],
        image_owners: false,
        binds,
    }
}

/// What can be said of an image's path without looking at the host: it is absolute.
pub fn validate_rootfs_path(path: &str) -> Result<PathBuf> {
    let p = PathBuf::from(path);
    if !p.is_absolute() {
        return Err(CoreError::InvalidArgument(format!(
            "image path {path:?} must be absolute"
        )));
    }
    Ok(p)
}

/// Checks a directory offered as a root filesystem image.
pub fn validate_rootfs(path: &str) -> Result<PathBuf> {
    let p = validate_rootfs_path(path)?;
    let meta = fs::metadata(&p)
        .map_err(|_| CoreError::InvalidArgument(format!("image path {path:?} does not exist")))?;
    if !meta.is_dir() {
        return Err(CoreError::InvalidArgument(format!(
            "image path {path:?} is not a directory"
        )));
    }
    let canon = fs::canonicalize(&p)?;
    if canon == Path::new("/") {
        return Err(CoreError::InvalidArgument(
            "the host's / cannot be an image".into(),
        ));
    }
    if !canon.join("bin/sh").exists() && !canon.join("usr/bin/sh").exists() {
        return Err(CoreError::InvalidArgument(format!(
            "{path:?} does not look like a root filesystem (no bin/sh)"
        )));
    }
    Ok(canon)
}

pub fn validate_image_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(CoreError::InvalidArgument(format!(
            "image name {name:?} must be 1-64 characters of a-z, A-Z, 0-9, '-', '_', '.'"
        )))
    }
}
