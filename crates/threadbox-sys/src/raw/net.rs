//! Network: the ioctl pair the sandbox's loopback needs, and the calls of the egress
//! kernel side (`crate::net`): sockets, netlink send/receive, `setns`, `SO_ORIGINAL_DST`.

use super::{cvt, cvt_int, owned};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

/// `SO_ORIGINAL_DST` (`linux/netfilter_ipv4.h`) and `IP6T_SO_ORIGINAL_DST`
/// (`linux/netfilter_ipv6/ip6_tables.h`): both 80, at `SOL_IP` and `SOL_IPV6`.
const SO_ORIGINAL_DST: libc::c_int = 80;
const IP6T_SO_ORIGINAL_DST: libc::c_int = 80;
/// `NS_GET_NSTYPE` = `_IO(0xb7, 0x3)` (`linux/nsfs.h`).
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

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

/// `socket(domain, ty | SOCK_CLOEXEC, protocol)`.
pub(crate) fn socket(domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: integer arguments.
    let fd = cvt_int(unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, protocol) })?;
    owned(fd as libc::c_long)
}

/// `setns(fd, nstype)`: moves the calling *thread* into the namespace `fd` names.
pub(crate) fn setns(fd: BorrowedFd<'_>, nstype: i32) -> io::Result<()> {
    // SAFETY: a valid descriptor and an integer; the call changes no memory of ours.
    cvt_int(unsafe { libc::setns(fd.as_raw_fd(), nstype) }).map(drop)
}

/// `ioctl(fd, NS_GET_NSTYPE)`: the `CLONE_NEW*` type of a namespace descriptor.
pub(crate) fn ns_type(fd: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: NS_GET_NSTYPE takes no argument and writes no memory.
    cvt_int(unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_NSTYPE) })
}

/// `send(fd, buf, 0)` (to the kernel, for an unconnected netlink socket).
pub(crate) fn send(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for reads of its length for the call.
    let n = unsafe { libc::send(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), 0) };
    cvt(n as libc::c_long).map(|n| n as usize)
}

/// `recv(fd, buf, flags)`.
pub(crate) fn recv(fd: BorrowedFd<'_>, buf: &mut [u8], flags: i32) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length for the call.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
    cvt(n as libc::c_long).map(|n| n as usize)
}

/// The address family of a socket (`getsockname`).
pub(crate) fn socket_family(fd: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: an out-buffer of the size passed in `len`, both alive for the call.
    cvt_int(unsafe {
        libc::getsockname(
            fd.as_raw_fd(),
            (&mut ss as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    })?;
    Ok(i32::from(ss.ss_family))
}

/// `getsockopt(fd, SOL_IP, SO_ORIGINAL_DST)`: where an IPv4 connection was headed before
/// a `redirect`/`dnat` rewrote it (from the connection's conntrack entry).
pub(crate) fn original_dst_v4(fd: BorrowedFd<'_>) -> io::Result<SocketAddrV4> {
    // SAFETY: sockaddr_in is plain old data; all-zero is a valid value.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: an out-buffer of the size passed in `len`, both alive for the call.
    cvt_int(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_IP,
            SO_ORIGINAL_DST,
            (&mut sin as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    })?;
    if i32::from(sin.sin_family) != libc::AF_INET {
        return Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT));
    }
    Ok(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
        u16::from_be(sin.sin_port),
    ))
}

/// `getsockopt(fd, SOL_IPV6, IP6T_SO_ORIGINAL_DST)`: [`original_dst_v4`] for IPv6.
pub(crate) fn original_dst_v6(fd: BorrowedFd<'_>) -> io::Result<SocketAddrV6> {
    // SAFETY: sockaddr_in6 is plain old data; all-zero is a valid value.
    let mut sin6: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
    // SAFETY: an out-buffer of the size passed in `len`, both alive for the call.
    cvt_int(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_IPV6,
            IP6T_SO_ORIGINAL_DST,
            (&mut sin6 as *mut libc::sockaddr_in6).cast(),
            &mut len,
        )
    })?;
    if i32::from(sin6.sin6_family) != libc::AF_INET6 {
        return Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT));
    }
    Ok(SocketAddrV6::new(
        Ipv6Addr::from(sin6.sin6_addr.s6_addr),
        u16::from_be(sin6.sin6_port),
        u32::from_be(sin6.sin6_flowinfo),
        sin6.sin6_scope_id,
    ))
}
