//! `threadbox net log SB [--follow] [--json]` (issue 13, ADR 0063): a sandbox's egress
//! log, one line per connection (when it closed) or DNS answer. `--follow` long-polls the
//! daemon from the last row seen.

use anyhow::Result;
use threadbox_api::net_log::{GetNetworkLog, NetLogRecord};
use threadbox_api::network::{NetAction, NetLogKind};
use threadbox_client::Client;

/// How long one follow request is held by the daemon.
const FOLLOW_WAIT_MS: u64 = 30_000;

fn wire<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => "?".into(),
    }
}

/// One line of the text form. Names and addresses come from the sandbox (a DNS question
/// is whatever it asked), so they are escaped before reaching the terminal.
pub fn line(r: &NetLogRecord) -> String {
    let e = &r.entry;
    let kind = match e.kind {
        NetLogKind::Tcp => "tcp",
        NetLogKind::Dns => "dns",
    };
    let decision = match e.decision {
        NetAction::Allow => "allow",
        NetAction::Deny => "deny",
    };
    let name = crate::term::escape(e.name.as_deref().unwrap_or("-"));
    let ip = crate::term::escape(e.ip.as_deref().unwrap_or("-"));
    let mut out = format!(
        "{} {} {kind} {decision} {} {name} {ip}",
        r.seq,
        e.at_ms,
        wire(&e.reason)
    );
    match e.kind {
        NetLogKind::Tcp => out.push_str(&format!(
            ":{} up={} down={}",
            e.port, e.bytes_up, e.bytes_down
        )),
        NetLogKind::Dns => {
            let q = crate::term::escape(e.qtype.as_deref().unwrap_or("?"));
            out.push_str(&format!(" {q} answers={}", e.answers.unwrap_or(0)));
        }
    }
    if e.name_ip_mismatch {
        out.push_str(" name_ip_mismatch");
    }
    out.push('\n');
    out
}

pub async fn log(
    client: &Client,
    sandbox: String,
    after: Option<u64>,
    limit: Option<u32>,
    follow: bool,
    json: bool,
) -> Result<u8> {
    let mut after = after;
    let mut dropped_seen = 0;
    loop {
        let page = client
            .call(&GetNetworkLog {
                sandbox: sandbox.clone(),
                after,
                limit,
                wait_ms: follow.then_some(FOLLOW_WAIT_MS),
            })
            .await?;
        let mut out = String::new();
        for r in &page.entries {
            if json {
                out.push_str(&serde_json::to_string(r)?);
                out.push('\n');
            } else {
                out.push_str(&line(r));
            }
        }
        crate::commands::write_stdout(out.as_bytes())?;
        if page.dropped > dropped_seen {
            eprintln!(
                "threadbox: the daemon dropped {} log rows it could not keep up with",
                page.dropped - dropped_seen
            );
            dropped_seen = page.dropped;
        }
        after = Some(page.next_after);
        // Without --follow: every page up to the end of the log.
        if !follow && page.entries.is_empty() {
            return Ok(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use threadbox_api::network::{NetLogEntry, NetReason};

    #[test]
    fn a_line_shows_the_row_and_escapes_what_the_sandbox_chose() {
        let r = NetLogRecord {
            seq: 4,
            entry: NetLogEntry {
                at_ms: 9,
                sandbox: "sb".into(),
                kind: NetLogKind::Dns,
                name: Some("evil\u{1b}[2J.test".into()),
                ip: Some("93.184.216.34".into()),
                port: 53,
                bytes_up: 0,
                bytes_down: 0,
                decision: NetAction::Deny,
                reason: NetReason::DefaultDeny,
                rule: None,
                name_ip_mismatch: false,
                qtype: Some("A".into()),
                answers: Some(0),
            },
        };
        let l = line(&r);
        assert!(l.starts_with("4 9 dns deny default_deny "), "{l}");
        assert!(!l.contains('\u{1b}'), "{l:?}");
        assert!(l.ends_with(" A answers=0\n"), "{l}");
    }
}
