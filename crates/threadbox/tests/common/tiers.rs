//! Which isolation tiers a suite runs on (issue 16, ADR 0123), for test files with a
//! daemon fixture of their own (`#[path = "common/tiers.rs"] mod tiers;`).
//!
//! `THREADBOX_TEST_TIERS=jail,gvisor` picks them; unset, every tier runs (`jail,gvisor`).
//! A tier the daemon lists as unavailable (no runsc) fails the test under CI, and is
//! skipped with its reason printed elsewhere; a test that needs a capability the tier
//! lacks is skipped on that tier with the capability named. Nothing passes quietly: every
//! skip prints one `skipped on tier …` line.

#![allow(dead_code)]

use serde_json::Value;

/// Every tier the suites know.
pub const ALL: &[&str] = &["jail", "gvisor"];

/// The tiers under test, in order.
pub fn under_test() -> Vec<String> {
    match std::env::var("THREADBOX_TEST_TIERS") {
        Ok(v) if !v.trim().is_empty() => v
            .split(',')
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .collect(),
        _ => ALL.iter().map(|t| t.to_string()).collect(),
    }
}

/// Whether a test runs on `tier`, given `threadbox tiers --json` of its daemon and the
/// capabilities it needs; prints why not.
pub fn runs_on(tier: &str, tiers_json: &Value, needs: &[&str]) -> bool {
    let Some(t) = tiers_json["tiers"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["name"] == tier))
    else {
        panic!("the daemon has no tier {tier:?}: {tiers_json}");
    };
    if t["available"] != true {
        let reason = t["reason"].as_str().unwrap_or("no reason given");
        assert!(
            std::env::var_os("CI").is_none(),
            "tier {tier} is unavailable under CI ({reason}); scripts/test.sh installs runsc"
        );
        eprintln!("skipped on tier {tier}: unavailable ({reason})");
        return false;
    }
    let caps: Vec<&str> = t["capabilities"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(missing) = needs.iter().find(|c| !caps.contains(c)) {
        eprintln!("skipped on tier {tier}: needs the {missing:?} capability");
        return false;
    }
    eprintln!("running on tier {tier}");
    true
}

/// Whether `tier` of `tiers_json` has `capability` (for a part of a test that needs it;
/// the caller prints what it leaves out).
pub fn has(tier: &str, tiers_json: &Value, capability: &str) -> bool {
    tiers_json["tiers"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["name"] == tier))
        .and_then(|t| t["capabilities"].as_array())
        .is_some_and(|c| c.iter().any(|c| c == capability))
}
