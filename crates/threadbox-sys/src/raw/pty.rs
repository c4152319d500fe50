//! Pseudo-terminals: unlock and open the peer of a master, window size, controlling tty,
//! ownership of the peer.

use super::{cvt_int, owned};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// `ioctl(master, TIOCSPTLCK, &0)`: unlocks the peer of a new master.
pub(crate) fn unlock(master: BorrowedFd<'_>) -> io::Result<()> {
    let zero: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int through the pointer, which points at a local that
    // outlives the call.
    cvt_int(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &zero) }).map(drop)
}

/// `ioctl(master, TIOCGPTPEER, flags)`: opens the master's peer without a path (Linux
/// 4.13), so nothing between the two opens can swap the device.
pub(crate) fn open_peer(master: BorrowedFd<'_>, flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: TIOCGPTPEER takes its flags as an integer argument and returns a new
    // descriptor, which `owned` takes ownership of.
    let rc = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags) };
    owned(cvt_int(rc)? as libc::c_long)
}

/// `ioctl(fd, TIOCSWINSZ, {rows, cols})`: the kernel sends SIGWINCH to the terminal's
/// foreground process group when the size changes.
pub(crate) fn set_winsize(fd: BorrowedFd<'_>, rows: u16, cols: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` through the pointer, a local that outlives
    // the call.
    cvt_int(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) }).map(drop)
}

/// `ioctl(fd, TIOCGWINSZ)`: (rows, cols).
pub(crate) fn get_winsize(fd: BorrowedFd<'_>) -> io::Result<(u16, u16)> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, a local that outlives
    // the call.
    cvt_int(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) })?;
    Ok((ws.ws_row, ws.ws_col))
}

/// `ioctl(fd, TIOCSCTTY, 0)`: makes the terminal `fd` the controlling terminal of the
/// calling session leader. Raw call, async-signal-safe (the child side of a fork).
pub(crate) fn set_controlling(fd: RawFd) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument (0: do not steal); no memory is passed.
    cvt_int(unsafe { libc::ioctl(fd, libc::TIOCSCTTY, 0) }).map(drop)
}

/// `fchown(fd, uid, gid)`.
pub(crate) fn fchown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: integer arguments only.
    cvt_int(unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) }).map(drop)
}

/// `tcgetattr(fd)`.
pub(crate) fn get_attr(fd: BorrowedFd<'_>) -> io::Result<libc::termios> {
    // SAFETY: termios is plain old data; all-zero is a valid value that tcgetattr
    // overwrites.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: tcgetattr writes one termios through the pointer, a local that outlives the
    // call.
    cvt_int(unsafe { libc::tcgetattr(fd.as_raw_fd(), &mut t) })?;
    Ok(t)
}

/// `tcsetattr(fd, TCSANOW, t)`.
pub(crate) fn set_attr(fd: BorrowedFd<'_>, t: &libc::termios) -> io::Result<()> {
    // SAFETY: tcsetattr reads one termios through the pointer, which lives for the call.
    cvt_int(unsafe { libc::tcsetattr(fd.as_raw_fd(), libc::TCSANOW, t) }).map(drop)
}

/// `cfmakeraw(t)`: the flags of raw mode on a copy the caller owns.
pub(crate) fn make_raw(t: &mut libc::termios) {
    // SAFETY: cfmakeraw only changes the fields of the termios it is given.
    unsafe { libc::cfmakeraw(t) }
}

/// `isatty(fd)`.
pub(crate) fn is_tty(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: integer argument; isatty only queries the descriptor.
    unsafe { libc::isatty(fd.as_raw_fd()) == 1 }
}
