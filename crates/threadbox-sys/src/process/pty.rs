//! Pseudo-terminals for the agent's terminal sessions (ADR 0092) and the CLI's raw mode.

use crate::raw;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// A new pseudo-terminal: the master the agent reads and writes, and its peer, the
/// terminal a child gets as stdio and controlling terminal.
#[derive(Debug)]
pub struct Pty {
    /// Non-blocking, close-on-exec.
    pub master: OwnedFd,
    /// Close-on-exec (the child's copies at 0, 1, 2 are not).
    pub peer: OwnedFd,
}

/// Opens a pty on this process's `/dev/ptmx` (in a sandbox, its own devpts instance),
/// sized `rows` × `cols`, the peer owned by `owner` (uid, gid) so the user's programs
/// that reopen their terminal by name (`tty`, `script`, `mesg`) may.
pub fn open_pty(rows: u16, cols: u16, owner: Option<(u32, u32)>) -> io::Result<Pty> {
    let master = raw::fd::open(
        c"/dev/ptmx",
        libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC | libc::O_NONBLOCK,
    )?;
    raw::pty::unlock(master.as_fd())?;
    let peer = raw::pty::open_peer(
        master.as_fd(),
        libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
    )?;
    raw::pty::set_winsize(peer.as_fd(), rows, cols)?;
    if let Some((uid, gid)) = owner {
        raw::pty::fchown(peer.as_fd(), uid, gid)?;
    }
    Ok(Pty { master, peer })
}

/// Sets a terminal's size; the kernel signals its foreground process group (SIGWINCH).
pub fn resize(fd: BorrowedFd<'_>, rows: u16, cols: u16) -> io::Result<()> {
    raw::pty::set_winsize(fd, rows, cols)
}

/// A terminal's size as (rows, cols).
pub fn window_size(fd: BorrowedFd<'_>) -> io::Result<(u16, u16)> {
    raw::pty::get_winsize(fd)
}

/// Whether `fd` is a terminal.
pub fn is_terminal(fd: BorrowedFd<'_>) -> bool {
    raw::pty::is_tty(fd)
}

/// A terminal in raw mode until this is dropped (also on unwinding), when its settings
/// are put back as they were.
pub struct RawMode {
    fd: OwnedFd,
    saved: libc::termios,
}

impl RawMode {
    /// Puts the terminal `fd` (duplicated: the guard keeps its own handle) in raw mode.
    pub fn enter(fd: BorrowedFd<'_>) -> io::Result<RawMode> {
        let fd = fd.try_clone_to_owned()?;
        let saved = raw::pty::get_attr(fd.as_fd())?;
        let mut t = saved;
        raw::pty::make_raw(&mut t);
        raw::pty::set_attr(fd.as_fd(), &t)?;
        Ok(RawMode { fd, saved })
    }

    /// Puts the saved settings back now.
    pub fn restore(&self) -> io::Result<()> {
        raw::pty::set_attr(self.fd.as_fd(), &self.saved)
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = self.restore();
    }
}

impl std::fmt::Debug for RawMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawMode").field("fd", &self.fd).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_pty_carries_bytes_and_its_size() {
        let pty = open_pty(24, 80, None).expect("open a pty");
        assert_eq!(window_size(pty.peer.as_fd()).unwrap(), (24, 80));
        resize(pty.master.as_fd(), 30, 100).unwrap();
        assert_eq!(window_size(pty.peer.as_fd()).unwrap(), (30, 100));
        assert!(is_terminal(pty.peer.as_fd()));
        let mut peer = std::fs::File::from(pty.peer);
        peer.write_all(b"hi\n").unwrap();
        let mut master = std::fs::File::from(pty.master);
        let mut buf = [0u8; 16];
        // Non-blocking: the bytes are there once the write returned (the line discipline
        // copies them synchronously).
        let n = master.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"hi\r\n", "ONLCR turns \\n into \\r\\n");
    }
}
