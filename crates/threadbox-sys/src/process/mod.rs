//! Sandbox processes: the policy a child enters between fork and exec ([`policy`]), how
//! the agent starts ([`spawn`]) and reaps ([`reap`]) them, the agent's own process
//! attributes ([`ids`]) and the selftest's posture probes ([`probe`]).

pub mod ids;
pub mod pidns;
pub mod policy;
pub mod probe;
pub mod pty;
pub mod reap;
pub mod spawn;

pub use ids::{
    assume_fs_identity, clear_supplementary_groups, set_child_subreaper, set_dumpable, set_umask,
    sync_all, FsIdentity,
};
pub use policy::{ChildPolicy, Weaken};
pub use probe::{
    ambient_capabilities, no_new_privs, probe_fsopen, probe_mount_tmpfs, probe_unshare,
};
pub use reap::{kill, kill_group, reap_any, reap_pid, WaitStatus};
pub use spawn::{
    clone3_unavailable, run_forked, spawn_in_cgroup, spawn_in_cgroup_passing, spawn_on_terminal,
    Spawned,
};
