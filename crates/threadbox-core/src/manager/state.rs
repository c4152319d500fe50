//! The lifecycle of a sandbox as one table: which operation is allowed in which state,
//! and what it does. Every lifecycle path of the manager (the API's pause, resume, stop,
//! start and delete, the implicit resume of a call on a paused sandbox, idle pause, the
//! TTL, the CPU-cap pause, reconcile after a restart) asks [`plan`] first, under the
//! sandbox's lifecycle lock, and records the result with `Store::transition`, which
//! only changes a row that is still in the state the plan started from.
//!
//! # Lock order
//!
//! Always in this order, never the other way round, each released before an `.await` on
//! anything slower than the store unless said otherwise:
//!
//! 1. `Manager::create_lock` (name uniqueness: held only around the existence check and
//!    the insert);
//! 2. the sandbox's `Live::lifecycle` mutex (held for the whole operation, across driver
//!    calls: one lifecycle operation per sandbox at a time);
//! 3. `GovState::admission` (quota check and the state change it admits);
//! 4. the store's connections (inside each query).
//!
//! `Live::conn` and the `Live` map are plain mutexes never held across an `.await`.

use crate::error::CoreError;
use crate::store::State;

/// What a caller wants of a sandbox's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `pause` through the API.
    Pause,
    /// The idle sweeper: pause a running sandbox with no call in flight. `inflight` is
    /// read under the lifecycle lock, where calls register, so no call can start between
    /// the check and the freeze (F1).
    IdlePause { inflight: usize },
    /// The idle sweeper: stop a running or paused sandbox that has had no call for its
    /// `idle_stop_secs`, with none in flight (same rule as `IdlePause`).
    IdleStop { inflight: usize },
    /// The daily CPU cap of the tenant was reached.
    CapPause,
    /// `hibernate` through the API: freeze, then push the memory out of RAM (ADR 0129).
    Hibernate,
    /// The idle sweeper: hibernate a running or paused sandbox that has had no call for
    /// its `idle_hibernate_secs`, with none in flight (same rule as `IdlePause`).
    IdleHibernate { inflight: usize },
    /// `resume` through the API.
    Resume,
    /// `start` through the API (a paused sandbox is resumed).
    Start,
    /// `stop` through the API, or the TTL with `stop`.
    Stop,
    /// `delete` through the API, or the TTL with `delete`; `force` stops a live one.
    Delete { force: bool },
    /// Reconcile after a daemon (re)start: the store's record against what is on the host.
    Recover(Found),
    /// A call that needs the sandbox's processes (exec, files, processes, selftest): runs
    /// on a running sandbox, resumes a paused one transparently (ADR 0002).
    Call,
}

/// What reconcile found on the host for a sandbox, probed according to its recorded state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Nothing probed (a stopped, creating or deleting row).
    Unprobed,
    /// A create was interrupted before its disk existed.
    NoDisk,
    /// Its cgroup is frozen: a paused sandbox whose agent cannot answer until thawed.
    Frozen,
    /// Its agent answered the handshake.
    Answers,
    /// Its agent process is alive but did not answer in time (a loaded host): never a
    /// reason to kill the user's processes (F6).
    Silent,
    /// Its agent is gone.
    Gone,
    /// Nothing of it runs and its processes are in a complete memory image (an image
    /// tier's hibernate, ADR 0130).
    Image,
}

/// What the manager does to carry an operation out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The sandbox already is where the operation leads (or the operation does not apply
    /// and is not an error, like an idle pause of a stopped sandbox).
    Keep,
    /// Freeze the cgroup: `Running → Paused`.
    Freeze,
    /// Thaw the cgroup, if the tenant's quota admits one more running sandbox:
    /// `Paused | Hibernated → Running` (a hibernated one's memory comes back on use).
    Thaw,
    /// Freeze if running, then push the memory out: `Running | Paused → Hibernated`.
    Hibernate,
    /// Boot a fresh agent on the kept disk, if the quota admits it: `Stopped → Running`.
    Boot,
    /// End every process, keep the disk: `Running | Paused → Stopped`.
    Halt,
    /// Record `Deleting`, destroy everything on the host, remove the row.
    Destroy,
    /// Take a live sandbox found after a restart back as it is: `Running | Paused |`
    /// `Hibernated → Paused` when frozen, else `Running` (a frozen hibernated one keeps
    /// its state: `Keep`).
    Adopt { paused: bool },
    /// A hibernate whose memory image was complete when the daemon died, before it was
    /// recorded: `Running | Paused → Hibernated` (ADR 0130).
    AdoptHibernated,
}

impl Step {
    /// The states the row may be in for this step's transition, and the state it ends in
    /// (`None`: the row goes away, or nothing changes).
    pub fn transition(self) -> (&'static [State], Option<State>) {
        match self {
            Step::Keep => (&[], None),
            Step::Freeze => (&[State::Running], Some(State::Paused)),
            Step::Thaw => (&[State::Paused, State::Hibernated], Some(State::Running)),
            Step::Hibernate => (&[State::Running, State::Paused], Some(State::Hibernated)),
            Step::Boot => (&[State::Stopped], Some(State::Running)),
            Step::Halt => (
                &[
                    State::Running,
                    State::Paused,
                    State::Hibernated,
                    State::Creating,
                ],
                Some(State::Stopped),
            ),
            Step::Destroy => (
                &[
                    State::Running,
                    State::Paused,
                    State::Hibernated,
                    State::Stopped,
                    State::Creating,
                    State::Deleting,
                ],
                Some(State::Deleting),
            ),
            Step::AdoptHibernated => (&[State::Running, State::Paused], Some(State::Hibernated)),
            Step::Adopt { paused } => (
                &[State::Running, State::Paused, State::Hibernated],
                Some(if paused {
                    State::Paused
                } else {
                    State::Running
                }),
            ),
        }
    }
}

fn not_running(id: &str, state: State) -> CoreError {
    CoreError::NotRunning {
        id: id.to_string(),
        state: state.as_str().into(),
    }
}

/// The one table. `id` only names the sandbox in errors.
pub fn plan(id: &str, state: State, op: Op) -> Result<Step, CoreError> {
    use Op::*;
    use State::*;
    Ok(match (op, state) {
        (Pause, Running) | (CapPause, Running) => Step::Freeze,
        (Pause, Paused | Hibernated) | (CapPause, _) => Step::Keep,
        (Pause, s) => return Err(not_running(id, s)),

        (Hibernate, Running | Paused) => Step::Hibernate,
        (Hibernate, Hibernated) => Step::Keep,
        (Hibernate, s) => return Err(not_running(id, s)),

        (IdleHibernate { inflight: 0 }, Running | Paused) => Step::Hibernate,
        (IdleHibernate { .. }, _) => Step::Keep,

        (IdlePause { inflight: 0 }, Running) => Step::Freeze,
        (IdlePause { .. }, _) => Step::Keep,

        (IdleStop { inflight: 0 }, Running | Paused | Hibernated) => Step::Halt,
        (IdleStop { .. }, _) => Step::Keep,

        (Resume, Paused | Hibernated) | (Call, Paused | Hibernated) => Step::Thaw,
        (Resume, Running) | (Call, Running) => Step::Keep,
        (Resume, s) | (Call, s) => return Err(not_running(id, s)),

        (Start, Stopped) => Step::Boot,
        (Start, Paused | Hibernated) => Step::Thaw,
        (Start, Running) => Step::Keep,
        (Start, s @ (Creating | Deleting)) => {
            return Err(CoreError::Conflict(format!(
                "sandbox {id} is {}; it cannot be started",
                s.as_str()
            )))
        }

        (Stop, Running | Paused | Hibernated | Creating) => Step::Halt,
        (Stop, Stopped) => Step::Keep,
        (Stop, Deleting) => {
            return Err(CoreError::Conflict(format!(
                "sandbox {id} is being deleted"
            )))
        }

        (Delete { force: false }, s @ (Running | Paused | Hibernated)) => {
            return Err(CoreError::Conflict(format!(
                "sandbox {id} is {}; stop it first or delete with force",
                s.as_str()
            )))
        }
        // A delete that failed half-way (`deleting`) can be retried (F3).
        (Delete { .. }, _) => Step::Destroy,

        // After a restart: finish what a crash interrupted, adopt what is alive.
        (Recover(_), Deleting) => Step::Destroy,
        (Recover(Found::NoDisk), Creating) => Step::Destroy,
        (Recover(_), Creating) => Step::Halt,
        (Recover(Found::Frozen | Found::Image), Hibernated) => Step::Keep,
        (Recover(Found::Image), Running | Paused) => Step::AdoptHibernated,
        (Recover(Found::Frozen), Running | Paused) => Step::Adopt { paused: true },
        (Recover(Found::Answers | Found::Silent), Running | Paused | Hibernated) => {
            Step::Adopt { paused: false }
        }
        (Recover(Found::Gone | Found::NoDisk | Found::Unprobed), Running | Paused | Hibernated) => {
            Step::Halt
        }
        (Recover(_), Stopped) => Step::Keep,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATES: [State; 6] = [
        State::Creating,
        State::Running,
        State::Paused,
        State::Hibernated,
        State::Stopped,
        State::Deleting,
    ];
    const OPS: [Op; 22] = [
        Op::Pause,
        Op::Hibernate,
        Op::IdleHibernate { inflight: 0 },
        Op::IdleHibernate { inflight: 1 },
        Op::IdlePause { inflight: 0 },
        Op::IdlePause { inflight: 1 },
        Op::IdleStop { inflight: 0 },
        Op::IdleStop { inflight: 1 },
        Op::CapPause,
        Op::Resume,
        Op::Start,
        Op::Stop,
        Op::Delete { force: false },
        Op::Delete { force: true },
        Op::Call,
        Op::Recover(Found::Unprobed),
        Op::Recover(Found::NoDisk),
        Op::Recover(Found::Frozen),
        Op::Recover(Found::Answers),
        Op::Recover(Found::Silent),
        Op::Recover(Found::Gone),
        Op::Recover(Found::Image),
    ];

    #[test]
    fn every_step_starts_from_a_state_its_transition_accepts() {
        for s in STATES {
            for op in OPS {
                if let Ok(step) = plan("sb-x", s, op) {
                    let (from, _) = step.transition();
                    assert!(
                        step == Step::Keep || from.contains(&s),
                        "{op:?} in {s:?} plans {step:?}, whose transition refuses {s:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_table() {
        let p = |s, op| plan("sb-x", s, op);
        assert_eq!(p(State::Running, Op::Pause).unwrap(), Step::Freeze);
        assert_eq!(p(State::Paused, Op::Pause).unwrap(), Step::Keep);
        assert!(matches!(
            p(State::Stopped, Op::Pause),
            Err(CoreError::NotRunning { .. })
        ));
        // F1: an idle pause never freezes a sandbox with a call in flight.
        assert_eq!(
            p(State::Running, Op::IdlePause { inflight: 1 }).unwrap(),
            Step::Keep
        );
        assert_eq!(
            p(State::Running, Op::IdlePause { inflight: 0 }).unwrap(),
            Step::Freeze
        );
        // Idle stop halts a live sandbox with nothing in flight, and nothing else.
        assert_eq!(
            p(State::Paused, Op::IdleStop { inflight: 0 }).unwrap(),
            Step::Halt
        );
        assert_eq!(
            p(State::Running, Op::IdleStop { inflight: 1 }).unwrap(),
            Step::Keep
        );
        assert_eq!(
            p(State::Creating, Op::IdleStop { inflight: 0 }).unwrap(),
            Step::Keep
        );
        assert_eq!(p(State::Paused, Op::Call).unwrap(), Step::Thaw);
        assert!(matches!(
            p(State::Stopped, Op::Call),
            Err(CoreError::NotRunning { .. })
        ));
        assert_eq!(p(State::Stopped, Op::Start).unwrap(), Step::Boot);
        assert_eq!(p(State::Paused, Op::Start).unwrap(), Step::Thaw);
        assert!(matches!(
            p(State::Running, Op::Delete { force: false }),
            Err(CoreError::Conflict(_))
        ));
        assert_eq!(
            p(State::Running, Op::Delete { force: true }).unwrap(),
            Step::Destroy
        );
        // F3: a delete that failed half-way can be retried.
        assert_eq!(
            p(State::Deleting, Op::Delete { force: false }).unwrap(),
            Step::Destroy
        );
        assert_eq!(p(State::Stopped, Op::Stop).unwrap(), Step::Keep);
        // Reconcile: a slow agent is adopted, never stopped (F6); a frozen one stays paused.
        assert_eq!(
            p(State::Running, Op::Recover(Found::Silent)).unwrap(),
            Step::Adopt { paused: false }
        );
        assert_eq!(
            p(State::Running, Op::Recover(Found::Frozen)).unwrap(),
            Step::Adopt { paused: true }
        );
        assert_eq!(
            p(State::Paused, Op::Recover(Found::Gone)).unwrap(),
            Step::Halt
        );
        assert_eq!(
            p(State::Creating, Op::Recover(Found::NoDisk)).unwrap(),
            Step::Destroy
        );
        assert_eq!(
            p(State::Creating, Op::Recover(Found::Unprobed)).unwrap(),
            Step::Halt
        );
        assert_eq!(
            p(State::Deleting, Op::Recover(Found::Unprobed)).unwrap(),
            Step::Destroy
        );
        assert_eq!(p(State::Stopped, Op::CapPause).unwrap(), Step::Keep);
    }

    #[test]
    fn hibernated_is_paused_with_its_memory_out() {
        let p = |s, op| plan("sb-x", s, op);
        assert_eq!(p(State::Running, Op::Hibernate).unwrap(), Step::Hibernate);
        assert_eq!(p(State::Paused, Op::Hibernate).unwrap(), Step::Hibernate);
        assert_eq!(p(State::Hibernated, Op::Hibernate).unwrap(), Step::Keep);
        assert!(matches!(
            p(State::Stopped, Op::Hibernate),
            Err(CoreError::NotRunning { .. })
        ));
        // Any call, resume or start wakes it; a pause leaves it as it is.
        for op in [Op::Call, Op::Resume, Op::Start] {
            assert_eq!(p(State::Hibernated, op).unwrap(), Step::Thaw, "{op:?}");
        }
        assert_eq!(p(State::Hibernated, Op::Pause).unwrap(), Step::Keep);
        // Idle: never with a call in flight; an idle pause does not touch it.
        assert_eq!(
            p(State::Running, Op::IdleHibernate { inflight: 1 }).unwrap(),
            Step::Keep
        );
        assert_eq!(
            p(State::Paused, Op::IdleHibernate { inflight: 0 }).unwrap(),
            Step::Hibernate
        );
        assert_eq!(
            p(State::Hibernated, Op::IdlePause { inflight: 0 }).unwrap(),
            Step::Keep
        );
        assert_eq!(
            p(State::Hibernated, Op::IdleStop { inflight: 0 }).unwrap(),
            Step::Halt
        );
        assert!(matches!(
            p(State::Hibernated, Op::Delete { force: false }),
            Err(CoreError::Conflict(_))
        ));
        // Reconcile keeps a frozen hibernated sandbox hibernated.
        assert_eq!(
            p(State::Hibernated, Op::Recover(Found::Frozen)).unwrap(),
            Step::Keep
        );
        assert_eq!(
            p(State::Hibernated, Op::Recover(Found::Gone)).unwrap(),
            Step::Halt
        );
    }

    #[test]
    fn a_complete_memory_image_is_hibernated_after_a_restart() {
        let p = |s, op| plan("sb-x", s, op);
        // Recorded or not yet (a crash between the image's rename and the row), a
        // complete image is a hibernated sandbox, never one to stop (ADR 0130).
        assert_eq!(
            p(State::Hibernated, Op::Recover(Found::Image)).unwrap(),
            Step::Keep
        );
        for s in [State::Running, State::Paused] {
            assert_eq!(
                p(s, Op::Recover(Found::Image)).unwrap(),
                Step::AdoptHibernated
            );
        }
        assert_eq!(
            Step::AdoptHibernated.transition().1,
            Some(State::Hibernated)
        );
    }
}
