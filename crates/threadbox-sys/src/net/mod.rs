//! The kernel side of sandbox egress (issue 13, ADR 0065): the fixed in-netns redirect,
//! sockets the daemon creates *inside* a sandbox's network namespace, `SO_ORIGINAL_DST`,
//! and network namespace handles checked by inode.
//!
//! The data path: a sandbox keeps its own netns with `lo` only. [`install_egress`] adds
//! one route (`local 0.0.0.0/0 dev lo`, so every IPv4 address is local) and a fixed
//! nf_tables table (TCP → redirect to a port below 1024, DNS → the DNS address, anything
//! else rejected). The daemon then makes listeners in that netns with
//! [`listener_in_netns`] (a short-lived `setns` thread: the socket stays in the sandbox's
//! netns, the daemon's threads stay in the host's), serves them from the host netns and
//! asks [`original_dst`] where each connection was headed. All policy is the daemon's
//! (threadbox-net); while it has no listener open, the kernel refuses everything.

mod host_addrs;
pub use host_addrs::{host_addresses, host_addresses_in};
mod netlink;
mod ruleset;
#[cfg(test)]
mod tests;

use crate::raw;
use crate::{Result, SysError};
use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, SocketAddrV4, TcpListener, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The default port the sandbox's TCP is redirected to. Below 1024, so nothing in the
/// sandbox (which holds no capability over its netns) can bind it, not even while the
/// daemon restarts (research §4, "squatting").
pub const DEFAULT_REDIRECT_PORT: u16 = 1;
/// The default address of the daemon's DNS socket inside a sandbox (`resolv.conf`).
pub const DEFAULT_DNS_ADDR: SocketAddrV4 =
    SocketAddrV4::new(std::net::Ipv4Addr::new(127, 0, 0, 53), 53);

/// What [`install_egress`] installs: the two numbers of the otherwise fixed ruleset.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct EgressConfig {
    /// Every TCP connection to a non-loopback address is redirected to
    /// `127.0.0.1:<redirect_port>` (must be 1..=1023).
    pub redirect_port: u16,
    /// TCP and UDP to port 53 anywhere are DNATed here (must be in 127.0.0.0/8 and on
    /// a port below 1024).
    pub dns_addr: SocketAddrV4,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            redirect_port: DEFAULT_REDIRECT_PORT,
            dns_addr: DEFAULT_DNS_ADDR,
        }
    }
}

impl EgressConfig {
    /// Refuses a configuration that would let the sandbox squat the daemon's sockets
    /// (a port ≥ 1024 is bindable from inside) or send DNS off loopback.
    pub fn validate(&self) -> Result<()> {
        if !(1..1024).contains(&self.redirect_port) {
            return Err(SysError::Other(format!(
                "egress redirect port {} must be in 1..=1023, so a sandbox cannot bind it",
                self.redirect_port
            )));
        }
        if !self.dns_addr.ip().is_loopback() || !(1..1024).contains(&self.dns_addr.port()) {
            return Err(SysError::Other(format!(
                "egress DNS address {} must be in 127.0.0.0/8 on a port in 1..=1023",
                self.dns_addr
            )));
        }
        Ok(())
    }
}

/// Installs the egress kernel side in the **calling thread's** network namespace: the
/// fixed nf_tables table first (one atomic batch), then the AnyIP route. Meant for
/// `sandbox_init`, right after `lo` is up, while it is still host root in the sandbox's
/// fresh netns. Fails (changing nothing) if the table already exists there.
pub fn install_egress(cfg: &EgressConfig) -> Result<()> {
    install_with(cfg, |proto| {
        raw::net::socket(libc::AF_NETLINK, libc::SOCK_RAW, proto)
            .map_err(|e| SysError::os("netlink socket", e))
    })
}

/// [`install_egress`] in the network namespace `netns`, from any thread: the netlink
/// sockets are made in `netns` (by [`socket_in_netns`]), and a netlink socket acts on
/// the namespace it was created in.
pub fn install_egress_in(netns: BorrowedFd<'_>, cfg: &EgressConfig) -> Result<()> {
    install_with(cfg, |proto| {
        in_netns(netns, move || {
            raw::net::socket(libc::AF_NETLINK, libc::SOCK_RAW, proto)
        })
    })
}

/// `make(proto)` opens a netlink socket of protocol `proto` in the target netns.
fn install_with(cfg: &EgressConfig, make: impl Fn(i32) -> Result<OwnedFd>) -> Result<()> {
    cfg.validate()?;
    let nft = make(libc::NETLINK_NETFILTER)?;
    let (batch, acked) = ruleset::nft_batch(cfg.redirect_port, cfg.dns_addr);
    transact(&nft, &batch, &acked)
        .map_err(|e| SysError::os("install the egress nf_tables table", e))?;
    let rt = make(libc::NETLINK_ROUTE)?;
    let route = ruleset::anyip_route(LOOPBACK_IFINDEX, 1);
    transact(&rt, &route, &[1]).map_err(|e| SysError::os("add the route local 0.0.0.0/0 dev lo", e))
}

/// `lo` is ifindex 1 in every netns (the kernel's `LOOPBACK_IFINDEX`); a name lookup
/// would look in the calling thread's netns, not the target's for [`install_egress_in`].
const LOOPBACK_IFINDEX: u32 = 1;

/// Sends `buf` on a netlink socket and checks that every sequence number in `acked` was
/// acknowledged without error. Netlink handles a send synchronously, so every answer is
/// queued when `send` returns: the reads never block, and a missing ack is an error.
fn transact(sock: &OwnedFd, buf: &[u8], acked: &[u32]) -> std::io::Result<()> {
    let n = raw::net::send(sock.as_fd(), buf)?;
    if n != buf.len() {
        return Err(std::io::Error::other("short netlink send"));
    }
    let mut pending: Vec<u32> = acked.to_vec();
    let mut rbuf = vec![0u8; 64 * 1024];
    while !pending.is_empty() {
        let n = match raw::net::recv(sock.as_fd(), &mut rbuf, libc::MSG_DONTWAIT) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(std::io::Error::other(format!(
                    "the kernel acknowledged {} of {} netlink messages",
                    acked.len() - pending.len(),
                    acked.len()
                )))
            }
            Err(e) => return Err(e),
        };
        for (seq, err) in netlink::parse_acks(&rbuf[..n])? {
            if err != 0 {
                return Err(std::io::Error::from_raw_os_error(-err));
            }
            pending.retain(|&s| s != seq);
        }
    }
    Ok(())
}

/// `socket(domain, ty, 0)` created inside the network namespace `netns` (a descriptor of
/// `/proc/<pid>/ns/net` or `/run/netns/<name>`), from a host-netns process.
///
/// A short-lived worker thread enters `netns` (`setns` is per thread), makes the socket
/// and ends, returning nothing but the descriptor: no thread of the daemon ever runs in
/// a sandbox's netns beyond this. The socket belongs to `netns` for its whole life,
/// whichever thread later uses it. `ty` may carry `SOCK_NONBLOCK`; `SOCK_CLOEXEC` is
/// always added.
pub fn socket_in_netns(netns: BorrowedFd<'_>, domain: i32, ty: i32) -> Result<OwnedFd> {
    in_netns(netns, move || raw::net::socket(domain, ty, 0))
}

/// Which kind of listener [`listener_in_netns`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// A listening TCP socket (`SO_REUSEADDR`, so a restarted daemon rebinds at once).
    Tcp,
    /// A bound UDP socket.
    Udp,
}

/// A socket bound to `addr` (and listening, for TCP) inside `netns`, non-blocking and
/// close-on-exec: ready for `tokio::net::TcpListener::from_std` / `UdpSocket::from_std`
/// after `TcpListener::from(fd)`. Binding as the daemon (host root) is what lets it hold
/// ports below 1024 that the sandbox cannot.
pub fn listener_in_netns(netns: BorrowedFd<'_>, proto: Proto, addr: SocketAddr) -> Result<OwnedFd> {
    in_netns(netns, move || {
        // std's binders create the socket in the calling thread's netns, which is the
        // sandbox's here; `bind` and `listen` then act on that socket.
        let fd = match proto {
            Proto::Tcp => {
                let l = TcpListener::bind(addr)?;
                l.set_nonblocking(true)?;
                OwnedFd::from(l)
            }
            Proto::Udp => {
                let s = UdpSocket::bind(addr)?;
                s.set_nonblocking(true)?;
                OwnedFd::from(s)
            }
        };
        Ok(fd)
    })
    .map_err(|e| match e {
        SysError::Os { source, .. } => SysError::os(
            format!("{proto:?} listener on {addr} in the sandbox netns"),
            source,
        ),
        other => other,
    })
}

/// [`listener_in_netns`] for TCP, typed.
pub fn tcp_listener_in_netns(netns: BorrowedFd<'_>, addr: SocketAddr) -> Result<TcpListener> {
    listener_in_netns(netns, Proto::Tcp, addr).map(TcpListener::from)
}

/// [`listener_in_netns`] for UDP, typed.
pub fn udp_socket_in_netns(netns: BorrowedFd<'_>, addr: SocketAddr) -> Result<UdpSocket> {
    listener_in_netns(netns, Proto::Udp, addr).map(UdpSocket::from)
}

/// Runs `make` on a fresh thread that first enters `netns`; the thread ends with it.
/// Private, and limited to returning a descriptor, so no other work can run in there.
fn in_netns(
    netns: BorrowedFd<'_>,
    make: impl FnOnce() -> std::io::Result<OwnedFd> + Send,
) -> Result<OwnedFd> {
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("tb-netns".into())
            .spawn_scoped(s, move || {
                raw::net::setns(netns, libc::CLONE_NEWNET)
                    .map_err(|e| SysError::os("setns into the sandbox netns", e))?;
                make().map_err(|e| SysError::os("socket in the sandbox netns", e))
            })
            .map_err(|e| SysError::os("spawn the setns thread", e))?;
        worker
            .join()
            .map_err(|_| SysError::Other("the setns thread panicked".into()))?
    })
}

/// Where a redirected connection was headed: `SO_ORIGINAL_DST` for IPv4 sockets,
/// `IP6T_SO_ORIGINAL_DST` for IPv6. Fails (ENOENT) for a connection the kernel did not
/// track, such as one made straight to the listener over the untracked loopback: the
/// caller must treat that as "deny".
pub fn original_dst(fd: BorrowedFd<'_>) -> Result<SocketAddr> {
    let family = raw::net::socket_family(fd).map_err(|e| SysError::os("getsockname", e))?;
    match family {
        libc::AF_INET => raw::net::original_dst_v4(fd).map(SocketAddr::V4),
        libc::AF_INET6 => raw::net::original_dst_v6(fd).map(SocketAddr::V6),
        _ => Err(std::io::Error::from_raw_os_error(libc::EAFNOSUPPORT)),
    }
    .map_err(|e| SysError::os("SO_ORIGINAL_DST", e))
}

/// Identity of a network namespace: the nsfs device and inode of its `ns/net` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NetnsId {
    pub dev: u64,
    pub inode: u64,
}

/// An open network namespace, with its identity as read from the open descriptor.
#[derive(Debug)]
pub struct NetNs {
    fd: OwnedFd,
    id: NetnsId,
}

impl NetNs {
    /// Opens `/proc/<pid>/ns/net`.
    pub fn open_pid(pid: i32) -> Result<NetNs> {
        if pid <= 0 {
            return Err(SysError::Other(format!("bad pid {pid}")));
        }
        NetNs::open_path(Path::new(&format!("/proc/{pid}/ns/net")))
    }

    /// Opens `/proc/<pid>/ns/net` and checks it is still the namespace `expected` (as
    /// recorded at boot): a reused pid (another process, maybe in the host netns) is
    /// refused, not silently entered. The check is on the open descriptor, so it cannot
    /// race with the pid being reused again.
    pub fn open_pid_checked(pid: i32, expected: NetnsId) -> Result<NetNs> {
        let ns = NetNs::open_pid(pid)?;
        if ns.id != expected {
            return Err(SysError::Other(format!(
                "pid {pid} is no longer in the sandbox's network namespace (inode {} expected, {} found)",
                expected.inode, ns.id.inode
            )));
        }
        Ok(ns)
    }

    /// Opens a network namespace file (`/proc/<pid>/ns/net`, `/run/netns/<name>`);
    /// refuses any other file.
    pub fn open_path(path: &Path) -> Result<NetNs> {
        let file = std::fs::File::open(path)
            .map_err(|e| SysError::os(format!("open {}", path.display()), e))?;
        let ty = raw::net::ns_type(file.as_fd())
            .map_err(|e| SysError::os(format!("{} is not a namespace", path.display()), e))?;
        if ty != libc::CLONE_NEWNET {
            return Err(SysError::Other(format!(
                "{} is not a network namespace",
                path.display()
            )));
        }
        let meta = file
            .metadata()
            .map_err(|e| SysError::os(format!("fstat {}", path.display()), e))?;
        Ok(NetNs {
            id: NetnsId {
                dev: meta.dev(),
                inode: meta.ino(),
            },
            fd: OwnedFd::from(file),
        })
    }

    /// The calling thread's own network namespace (`/proc/thread-self/ns/net`): lets the
    /// daemon refuse to treat the host's namespace as a sandbox's.
    pub fn current() -> Result<NetNs> {
        NetNs::open_path(Path::new("/proc/thread-self/ns/net"))
    }

    pub fn id(&self) -> NetnsId {
        self.id
    }
}

impl AsFd for NetNs {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The identity of `pid`'s network namespace (to record at boot and check on adopt).
pub fn netns_inode(pid: i32) -> Result<NetnsId> {
    NetNs::open_pid(pid).map(|ns| ns.id())
}
