//! The sandbox's disk image on a loop device.

use crate::raw;
use crate::raw::loopdev::LoopConfig;
use crate::{Result, SysError};
use std::fs;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// Offset of `lo_flags` in `struct loop_info64`.
const LO_FLAGS_OFFSET: usize = 52;

/// Attaches `image` to a free loop device with autoclear: the device is released as soon
/// as its last user (our mount, in the sandbox's mount namespace) is gone.
pub(super) fn attach_loop(image: &Path) -> Result<(OwnedFd, PathBuf)> {
    let backing = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .map_err(|e| SysError::os(format!("open {}", image.display()), e))?;
    let ctl = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .map_err(|e| SysError::os("open /dev/loop-control", e))?;
    // Another helper may take the same free device between GET_FREE and CONFIGURE.
    for _ in 0..32 {
        let n = raw::loopdev::get_free(ctl.as_fd())
            .map_err(|e| SysError::os("LOOP_CTL_GET_FREE", e))?;
        let dev = PathBuf::from(format!("/dev/loop{n}"));
        let loopf = match fs::OpenOptions::new().read(true).write(true).open(&dev) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(SysError::os(format!("open {}", dev.display()), e)),
        };
        let mut cfg = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            info: [0; 232],
            reserved: [0; 8],
        };
        cfg.info[LO_FLAGS_OFFSET..LO_FLAGS_OFFSET + 4]
            .copy_from_slice(&LO_FLAGS_AUTOCLEAR.to_ne_bytes());
        match raw::loopdev::configure(loopf.as_fd(), &cfg) {
            Ok(()) => return Ok((OwnedFd::from(loopf), dev)),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => return Err(SysError::os(format!("LOOP_CONFIGURE {}", dev.display()), e)),
        }
    }
    Err(SysError::Other("no free loop device".into()))
}
