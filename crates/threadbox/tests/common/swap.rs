//! A swap file for tests of the jail's hibernate (ADR 0129), on for the guard's life and
//! removed after (`swapoff` on drop, also when the test fails). For test files with their
//! own harness: `#[path = "../common/swap.rs"] mod swap;`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

pub struct Swap {
    file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Swap {
    pub fn on(mib: u64) -> Swap {
        let dir = tempfile::Builder::new()
            .prefix("tb-swap-")
            .tempdir()
            .expect("tempdir");
        let file = dir.path().join("swap");
        let run = |cmd: &mut Command| {
            let out = cmd.output().expect("run");
            assert!(
                out.status.success(),
                "{cmd:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(Command::new("fallocate")
            .args(["-l", &format!("{mib}M")])
            .arg(&file));
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod swap");
        run(Command::new("mkswap").arg("-q").arg(&file));
        run(Command::new("swapon").arg(&file));
        Swap { file, _dir: dir }
    }
}

impl Drop for Swap {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(&self.file).status();
    }
}
