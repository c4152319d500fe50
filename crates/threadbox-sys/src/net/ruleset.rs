//! The fixed egress ruleset (research/network.md §8.2) as netlink messages: the AnyIP
//! route and one nf_tables batch. Nothing here is per-policy: the table is the same for
//! every sandbox but for the redirect port and the DNS address, and never changes after
//! boot (ADR 0065).
//!
//! ```text
//! table inet threadbox {
//!   chain raw    { type filter hook output priority raw;  # -300
//!     ip daddr 127.0.0.0/8 notrack; ip6 daddr ::1 notrack }
//!   chain nat    { type nat hook output priority -100;
//!     ip daddr 127.0.0.0/8 return
//!     meta nfproto ipv4 udp dport 53 dnat ip to <dns>
//!     meta nfproto ipv4 tcp dport 53 dnat ip to <dns>
//!     meta l4proto tcp redirect to :<port> }
//!   chain filter { type filter hook output priority filter; policy drop;
//!     ct direction reply accept
//!     ip daddr 127.0.0.0/8 accept; ip6 daddr ::1 accept
//!     reject with icmpx admin-prohibited }
//! }
//! ```

use super::netlink::{Msg, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST};
use std::net::SocketAddrV4;

pub(crate) const TABLE: &str = "threadbox";

// linux/netfilter/nfnetlink.h, nf_tables.h, netfilter.h
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const NF_INET_LOCAL_OUT: u32 = 3;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
const NFT_RETURN: i32 = -5;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;

const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;

const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFT_META_NFPROTO: u32 = 15;
const NFT_META_L4PROTO: u32 = 16;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFT_CMP_EQ: u32 = 0;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_CT_DREG: u16 = 1;
const NFTA_CT_KEY: u16 = 2;
const NFT_CT_DIRECTION: u32 = 1;
const IP_CT_DIR_REPLY: u8 = 1;
const NFTA_NAT_TYPE: u16 = 1;
const NFTA_NAT_FAMILY: u16 = 2;
const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
const NFT_NAT_DNAT: u32 = 1;
const NFTA_REDIR_REG_PROTO_MIN: u16 = 1;
const NFTA_REJECT_TYPE: u16 = 1;
const NFTA_REJECT_ICMP_CODE: u16 = 2;
const NFT_REJECT_ICMPX_UNREACH: u32 = 2;
const NFT_REJECT_ICMPX_ADMIN_PROHIBITED: u8 = 3;

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

// linux/rtnetlink.h
const RTM_NEWROUTE: u16 = 24;
const RT_TABLE_LOCAL: u8 = 255;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_HOST: u8 = 254;
const RTN_LOCAL: u8 = 2;
const RTA_OIF: u16 = 4;
const RTA_TABLE: u16 = 15;

/// Chain priorities of `nft`'s names: `raw`, `dstnat` (on output: -100), `filter`.
const PRIO_RAW: i32 = -300;
const PRIO_NAT: i32 = -100;
const PRIO_FILTER: i32 = 0;

/// `nfgenmsg`: family, version 0, resource id (big-endian).
fn nfgen(family: u8, res_id: u16) -> [u8; 4] {
    let r = res_id.to_be_bytes();
    [family, 0, r[0], r[1]]
}

fn nft_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | msg
}

/// One nf_tables expression (`NFTA_LIST_ELEM` of a rule).
fn expr(m: &mut Msg, name: &str, data: impl FnOnce(&mut Msg)) {
    m.nest(NFTA_LIST_ELEM, |m| {
        m.str(NFTA_EXPR_NAME, name);
        m.nest(NFTA_EXPR_DATA, data);
    });
}

fn meta(m: &mut Msg, key: u32) {
    expr(m, "meta", |m| {
        m.be32(NFTA_META_KEY, key).be32(NFTA_META_DREG, NFT_REG_1);
    });
}

fn cmp_eq(m: &mut Msg, value: &[u8]) {
    expr(m, "cmp", |m| {
        m.be32(NFTA_CMP_SREG, NFT_REG_1)
            .be32(NFTA_CMP_OP, NFT_CMP_EQ)
            .nest(NFTA_CMP_DATA, |m| {
                m.attr(NFTA_DATA_VALUE, value);
            });
    });
}

fn payload(m: &mut Msg, base: u32, offset: u32, len: u32) {
    expr(m, "payload", |m| {
        m.be32(NFTA_PAYLOAD_DREG, NFT_REG_1)
            .be32(NFTA_PAYLOAD_BASE, base)
            .be32(NFTA_PAYLOAD_OFFSET, offset)
            .be32(NFTA_PAYLOAD_LEN, len);
    });
}

fn bitwise(m: &mut Msg, mask: &[u8]) {
    let xor = vec![0u8; mask.len()];
    expr(m, "bitwise", |m| {
        m.be32(NFTA_BITWISE_SREG, NFT_REG_1)
            .be32(NFTA_BITWISE_DREG, NFT_REG_1)
            .be32(NFTA_BITWISE_LEN, mask.len() as u32)
            .nest(NFTA_BITWISE_MASK, |m| {
                m.attr(NFTA_DATA_VALUE, mask);
            })
            .nest(NFTA_BITWISE_XOR, |m| {
                m.attr(NFTA_DATA_VALUE, &xor);
            });
    });
}

fn immediate(m: &mut Msg, reg: u32, value: &[u8]) {
    expr(m, "immediate", |m| {
        m.be32(NFTA_IMMEDIATE_DREG, reg)
            .nest(NFTA_IMMEDIATE_DATA, |m| {
                m.attr(NFTA_DATA_VALUE, value);
            });
    });
}

fn verdict(m: &mut Msg, code: i32) {
    expr(m, "immediate", |m| {
        m.be32(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT)
            .nest(NFTA_IMMEDIATE_DATA, |m| {
                m.nest(NFTA_DATA_VERDICT, |m| {
                    m.be32(NFTA_VERDICT_CODE, code as u32);
                });
            });
    });
}

/// `meta nfproto ipv4 ip daddr 127.0.0.0/8` (in an `inet` table the family check comes
/// first, or the offset would read an IPv6 header).
fn ip_daddr_loopback(m: &mut Msg) {
    meta(m, NFT_META_NFPROTO);
    cmp_eq(m, &[NFPROTO_IPV4]);
    payload(m, NFT_PAYLOAD_NETWORK_HEADER, 16, 4);
    bitwise(m, &[0xff, 0, 0, 0]);
    cmp_eq(m, &[127, 0, 0, 0]);
}

/// `meta nfproto ipv6 ip6 daddr ::1`.
fn ip6_daddr_loopback(m: &mut Msg) {
    meta(m, NFT_META_NFPROTO);
    cmp_eq(m, &[NFPROTO_IPV6]);
    payload(m, NFT_PAYLOAD_NETWORK_HEADER, 24, 16);
    cmp_eq(m, &std::net::Ipv6Addr::LOCALHOST.octets());
}

fn l4proto(m: &mut Msg, proto: u8) {
    meta(m, NFT_META_L4PROTO);
    cmp_eq(m, &[proto]);
}

/// `th dport <port>` (after an `l4proto` check, so the offset is a TCP/UDP port).
fn dport(m: &mut Msg, port: u16) {
    payload(m, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
    cmp_eq(m, &port.to_be_bytes());
}

fn notrack(m: &mut Msg) {
    // `notrack` has no attributes; an empty NFTA_EXPR_DATA is accepted.
    m.nest(NFTA_LIST_ELEM, |m| {
        m.str(NFTA_EXPR_NAME, "notrack");
    });
}

fn dnat_v4(m: &mut Msg, to: SocketAddrV4) {
    immediate(m, NFT_REG_1, &to.ip().octets());
    immediate(m, NFT_REG_2, &to.port().to_be_bytes());
    expr(m, "nat", |m| {
        m.be32(NFTA_NAT_TYPE, NFT_NAT_DNAT)
            .be32(NFTA_NAT_FAMILY, u32::from(NFPROTO_IPV4))
            .be32(NFTA_NAT_REG_ADDR_MIN, NFT_REG_1)
            .be32(NFTA_NAT_REG_PROTO_MIN, NFT_REG_2);
    });
}

fn redirect(m: &mut Msg, port: u16) {
    immediate(m, NFT_REG_1, &port.to_be_bytes());
    expr(m, "redir", |m| {
        m.be32(NFTA_REDIR_REG_PROTO_MIN, NFT_REG_1);
    });
}

fn ct_reply(m: &mut Msg) {
    expr(m, "ct", |m| {
        m.be32(NFTA_CT_KEY, NFT_CT_DIRECTION)
            .be32(NFTA_CT_DREG, NFT_REG_1);
    });
    cmp_eq(m, &[IP_CT_DIR_REPLY]);
}

fn reject_admin(m: &mut Msg) {
    expr(m, "reject", |m| {
        m.be32(NFTA_REJECT_TYPE, NFT_REJECT_ICMPX_UNREACH)
            .attr(NFTA_REJECT_ICMP_CODE, &[NFT_REJECT_ICMPX_ADMIN_PROHIBITED]);
    });
}

/// The messages of the batch, in order, without the begin/end markers.
struct Batch {
    msgs: Vec<Vec<u8>>,
    seq: u32,
}

impl Batch {
    fn next_seq(&mut self) -> u32 {
        self.seq += 1;
        self.seq
    }

    fn table(&mut self) {
        let seq = self.next_seq();
        // EXCL: a second install in the same netns fails (EEXIST) instead of appending
        // the rules twice; the batch is atomic, so it changes nothing.
        let flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK;
        let mut m = Msg::new(nft_type(NFT_MSG_NEWTABLE), flags, seq);
        m.payload(&nfgen(NFPROTO_INET, 0));
        m.str(NFTA_TABLE_NAME, TABLE).be32(NFTA_TABLE_FLAGS, 0);
        self.msgs.push(m.finish());
    }

    fn chain(&mut self, name: &str, ty: &str, prio: i32, policy: Option<u32>) {
        let seq = self.next_seq();
        let flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK;
        let mut m = Msg::new(nft_type(NFT_MSG_NEWCHAIN), flags, seq);
        m.payload(&nfgen(NFPROTO_INET, 0));
        m.str(NFTA_CHAIN_TABLE, TABLE)
            .str(NFTA_CHAIN_NAME, name)
            .nest(NFTA_CHAIN_HOOK, |m| {
                m.be32(NFTA_HOOK_HOOKNUM, NF_INET_LOCAL_OUT)
                    .be32(NFTA_HOOK_PRIORITY, prio as u32);
            });
        if let Some(p) = policy {
            m.be32(NFTA_CHAIN_POLICY, p);
        }
        m.str(NFTA_CHAIN_TYPE, ty);
        self.msgs.push(m.finish());
    }

    fn rule(&mut self, chain: &str, exprs: impl FnOnce(&mut Msg)) {
        let seq = self.next_seq();
        let flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND | NLM_F_ACK;
        let mut m = Msg::new(nft_type(NFT_MSG_NEWRULE), flags, seq);
        m.payload(&nfgen(NFPROTO_INET, 0));
        m.str(NFTA_RULE_TABLE, TABLE)
            .str(NFTA_RULE_CHAIN, chain)
            .nest(NFTA_RULE_EXPRESSIONS, exprs);
        self.msgs.push(m.finish());
    }
}

/// The nf_tables batch of the fixed table, framed by BATCH_BEGIN/END, as one buffer to
/// send in one `send`. Returns the buffer and the sequence numbers that must be acked.
pub(crate) fn nft_batch(redirect_port: u16, dns: SocketAddrV4) -> (Vec<u8>, Vec<u32>) {
    let mut b = Batch {
        msgs: Vec::new(),
        seq: 0,
    };
    let begin_seq = b.next_seq();
    b.table();
    b.chain("raw", "filter", PRIO_RAW, None);
    b.chain("nat", "nat", PRIO_NAT, None);
    b.chain("filter", "filter", PRIO_FILTER, Some(NF_DROP));
    // Loopback is never tracked: a sandbox's own local traffic costs no conntrack entry
    // (research §4, 2000 connections → 2000 entries without this) and needs no NAT.
    b.rule("raw", |m| {
        ip_daddr_loopback(m);
        notrack(m);
    });
    b.rule("raw", |m| {
        ip6_daddr_loopback(m);
        notrack(m);
    });
    b.rule("nat", |m| {
        ip_daddr_loopback(m);
        verdict(m, NFT_RETURN);
    });
    for proto in [IPPROTO_UDP, IPPROTO_TCP] {
        b.rule("nat", |m| {
            // `dnat ip` is IPv4 only (no IPv6 route leaves `lo` anyway).
            meta(m, NFT_META_NFPROTO);
            cmp_eq(m, &[NFPROTO_IPV4]);
            l4proto(m, proto);
            dport(m, 53);
            dnat_v4(m, dns);
        });
    }
    b.rule("nat", |m| {
        l4proto(m, IPPROTO_TCP);
        redirect(m, redirect_port);
    });
    // Replies of the daemon's sockets to redirected flows leave with the sandbox-chosen
    // (non-loopback) address as destination: without this they would be dropped.
    b.rule("filter", |m| {
        ct_reply(m);
        verdict(m, NF_ACCEPT as i32);
    });
    b.rule("filter", |m| {
        ip_daddr_loopback(m);
        verdict(m, NF_ACCEPT as i32);
    });
    b.rule("filter", |m| {
        ip6_daddr_loopback(m);
        verdict(m, NF_ACCEPT as i32);
    });
    b.rule("filter", reject_admin);
    let end_seq = b.next_seq();

    let mut out = Vec::new();
    let mut begin = Msg::new(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, begin_seq);
    begin.payload(&nfgen(0, NFNL_SUBSYS_NFTABLES));
    out.extend(begin.finish());
    let acked: Vec<u32> = (begin_seq + 1..end_seq).collect();
    for m in b.msgs {
        out.extend(m);
    }
    let mut end = Msg::new(NFNL_MSG_BATCH_END, NLM_F_REQUEST, end_seq);
    end.payload(&nfgen(0, NFNL_SUBSYS_NFTABLES));
    out.extend(end.finish());
    (out, acked)
}

/// `ip route add local 0.0.0.0/0 dev <lo_index>` (table local, scope host, proto boot):
/// every IPv4 address is local, so a connect anywhere stays on `lo` and meets the nat
/// chain. No IPv6 counterpart on purpose: IPv6 other than `::1` gets ENETUNREACH.
pub(crate) fn anyip_route(lo_index: u32, seq: u32) -> Vec<u8> {
    let flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK;
    let mut m = Msg::new(RTM_NEWROUTE, flags, seq);
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
    let mut rtmsg = [0u8; 12];
    rtmsg[0] = libc::AF_INET as u8;
    rtmsg[4] = RT_TABLE_LOCAL;
    rtmsg[5] = RTPROT_BOOT;
    rtmsg[6] = RT_SCOPE_HOST;
    rtmsg[7] = RTN_LOCAL;
    m.payload(&rtmsg);
    m.ne32(RTA_TABLE, u32::from(RT_TABLE_LOCAL))
        .ne32(RTA_OIF, lo_index);
    m.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_is_framed_and_every_inner_message_asks_an_ack() {
        let (buf, acked) = nft_batch(1, "127.0.0.53:53".parse().unwrap());
        // table + 3 chains + 10 rules
        assert_eq!(acked.len(), 14);
        let mut off = 0;
        let mut seen = Vec::new();
        while off < buf.len() {
            let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap()) as usize;
            let ty = u16::from_ne_bytes(buf[off + 4..off + 6].try_into().unwrap());
            let flags = u16::from_ne_bytes(buf[off + 6..off + 8].try_into().unwrap());
            let seq = u32::from_ne_bytes(buf[off + 8..off + 12].try_into().unwrap());
            assert_eq!(len % 4, 0);
            seen.push((ty, flags & NLM_F_ACK != 0, seq));
            off += len;
        }
        assert_eq!(off, buf.len());
        assert_eq!(seen.first().map(|s| s.0), Some(NFNL_MSG_BATCH_BEGIN));
        assert_eq!(seen.last().map(|s| s.0), Some(NFNL_MSG_BATCH_END));
        let inner: Vec<u32> = seen[1..seen.len() - 1]
            .iter()
            .map(|&(ty, ack, seq)| {
                assert_eq!(ty >> 8, NFNL_SUBSYS_NFTABLES);
                assert!(ack);
                seq
            })
            .collect();
        assert_eq!(inner, acked);
    }
}
