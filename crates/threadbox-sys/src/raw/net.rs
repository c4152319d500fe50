//! Network interfaces: the one ioctl pair the sandbox's loopback needs.

use super::{cvt_int, owned};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// `socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)`: a handle for interface ioctls.
pub(crate) fn inet_dgram_socket() -> io::Result<OwnedFd> {
    // SAFETY: integer arguments.
    let fd =
        cvt_int(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    owned(fd as libc::c_long)
}

fn ifreq(name: &[u8]) -> io::Result<libc::ifreq> {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= ifr.ifr_name.len() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    for (i, b) in name.iter().enumerate() {
        ifr.ifr_name[i] = *b as libc::c_char;
    }
    Ok(ifr)
}

/// `SIOCGIFFLAGS` of interface `name`.
pub(crate) fn if_flags(sock: &OwnedFd, name: &[u8]) -> io::Result<libc::c_short> {
    let mut ifr = ifreq(name)?;
    // SAFETY: SIOCGIFFLAGS fills `ifr`, a valid ifreq that outlives the call.
    cvt_int(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) })?;
    // SAFETY: the flags member of the union is the one SIOCGIFFLAGS has just set.
    Ok(unsafe { ifr.ifr_ifru.ifru_flags })
}

/// `SIOCSIFFLAGS` of interface `name`.
pub(crate) fn set_if_flags(sock: &OwnedFd, name: &[u8], flags: libc::c_short) -> io::Result<()> {
    let mut ifr = ifreq(name)?;
    ifr.ifr_ifru.ifru_flags = flags;
    // SAFETY: SIOCSIFFLAGS reads `ifr`, a valid ifreq whose flags member is set.
    cvt_int(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) }).map(drop)
}
