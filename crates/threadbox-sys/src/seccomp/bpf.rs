//! The compiler from the policy tables to a classic BPF program: a prefix that kills
//! foreign architectures and x32 numbers, then a balanced search tree over runs of system
//! call numbers (ADR 0013).

use super::*;
use crate::{Result, SysError};

// Classic BPF opcodes and seccomp constants.
/// BPF_LD | BPF_W | BPF_ABS (LD and W are 0).
pub(crate) const BPF_LD_W_ABS: u16 = 0x20;
pub(crate) const BPF_JMP_JA: u16 = 0x05;
pub(crate) const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
pub(crate) const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
pub(crate) const BPF_JMP_JSET_K: u16 = 0x05 | 0x40;
pub(crate) const BPF_RET_K: u16 = 0x06;
pub(crate) const SECCOMP_DATA_NR: u32 = 0;
pub(crate) const SECCOMP_DATA_ARCH: u32 = 4;
/// Offset of `args[0]` in `struct seccomp_data`; the low half of each little-endian u64
/// comes first, so loading a word here reads the low 32 bits the kernel itself uses.
pub(crate) const SECCOMP_DATA_ARGS: u32 = 16;
pub(crate) const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
pub(crate) const X32_SYSCALL_BIT: u32 = 0x4000_0000;

pub(crate) fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

pub(crate) fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

pub(crate) const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
pub(crate) const RET_EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
pub(crate) const RET_ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

/// The action for one run of system call numbers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Action {
    Ret(u32),
    /// A [`CONDITIONAL`] call: its argument test.
    Check(Refuse),
}

impl Action {
    fn same(&self, other: &Action) -> bool {
        matches!((self, other), (Action::Ret(a), Action::Ret(b)) if a == b)
    }
}

/// Emits the argument test of a conditional call; every path ends in a return.
pub(crate) fn emit_check(r: Refuse, out: &mut Vec<sock_filter>) -> Result<()> {
    emit_refuse_if(r, out)?;
    out.push(stmt(BPF_RET_K, RET_ALLOW));
    Ok(())
}

/// Emits code that returns `EPERM` when `r` holds and falls through otherwise.
pub(crate) fn emit_refuse_if(r: Refuse, out: &mut Vec<sock_filter>) -> Result<()> {
    let load = |arg: u32| stmt(BPF_LD_W_ABS, SECCOMP_DATA_ARGS + 8 * arg);
    match r {
        Refuse::AnyBit { arg, mask } => {
            out.push(load(arg));
            out.push(jump(BPF_JMP_JSET_K, mask, 0, 1));
            out.push(stmt(BPF_RET_K, RET_EPERM));
        }
        Refuse::OneOf { arg, values } | Refuse::NoneOf { arg, values } => {
            let n = values.len();
            if n == 0 || n > 200 {
                return Err(SysError::Other(
                    "a seccomp argument list of bad size".into(),
                ));
            }
            out.push(load(arg));
            let one_of = matches!(r, Refuse::OneOf { .. });
            // OneOf: a match jumps to the EPERM return (after a skip over it at the end
            // of the chain). NoneOf: a match jumps past the EPERM return.
            for (i, v) in values.iter().enumerate() {
                // Past the rest of the chain, then onto (OneOf) or over (NoneOf) the EPERM.
                let jt = (n - i) as u8;
                out.push(jump(BPF_JMP_JEQ_K, *v, jt, 0));
            }
            if one_of {
                out.push(stmt(BPF_JMP_JA, 1));
                out.push(stmt(BPF_RET_K, RET_EPERM));
            } else {
                out.push(stmt(BPF_RET_K, RET_EPERM));
            }
        }
        Refuse::Any(tests) => {
            for t in tests {
                emit_refuse_if(*t, out)?;
            }
        }
    }
    Ok(())
}

/// Emits a balanced search over `runs` (sorted by start, the first starting at 0) that
/// ends in the action of the run containing the number in the accumulator.
pub(crate) fn emit_tree(runs: &[(u32, Action)], out: &mut Vec<sock_filter>) -> Result<()> {
    match runs {
        [] => Err(SysError::Other("empty seccomp run list".into())),
        [(_, Action::Ret(k))] => {
            out.push(stmt(BPF_RET_K, *k));
            Ok(())
        }
        [(_, Action::Check(r))] => emit_check(*r, out),
        _ => {
            let mid = runs.len() / 2;
            let (low, high) = runs.split_at(mid);
            let mut upper = Vec::new();
            emit_tree(high, &mut upper)?;
            // nr >= start of the upper half: fall into it; else skip over it to the lower.
            match u8::try_from(upper.len()) {
                Ok(skip) => out.push(jump(BPF_JMP_JGE_K, high[0].0, 0, skip)),
                Err(_) => {
                    out.push(jump(BPF_JMP_JGE_K, high[0].0, 1, 0));
                    out.push(stmt(BPF_JMP_JA, upper.len() as u32));
                }
            }
            out.extend(upper);
            emit_tree(low, out)
        }
    }
}

/// Compiles the sandbox policy to a BPF program (x86_64).
pub fn sandbox_filter() -> Result<BpfProgram> {
    compile(&[])
}

/// Compiles the agent's own filter: the sandbox policy with the calls of [`AGENT_ALLOW`]
/// allowed as well (see there for why it cannot be narrower).
pub fn agent_filter() -> Result<BpfProgram> {
    compile(AGENT_ALLOW)
}

/// The sandbox tables, with every call of `also_allow` allowed instead of its verdict
/// there.
fn compile(also_allow: &[Group]) -> Result<BpfProgram> {
    if !cfg!(target_arch = "x86_64") {
        return Err(SysError::Other(
            "the seccomp policy is written for x86_64 only".into(),
        ));
    }
    let extra: Vec<&Syscall> = also_allow.iter().flat_map(|g| g.calls.iter()).collect();
    let overridden = |c: &&Syscall| !extra.iter().any(|x| x.nr == c.nr);
    let mut actions: std::collections::BTreeMap<u32, Action> = std::collections::BTreeMap::new();
    let named = ALLOW
        .iter()
        .flat_map(|g| g.calls.iter().map(|c| (c, Action::Ret(RET_ALLOW))))
        .chain(extra.iter().map(|c| (*c, Action::Ret(RET_ALLOW))))
        .chain(
            DENY.iter()
                .flat_map(|g| g.calls.iter())
                .filter(overridden)
                .map(|c| (c, Action::Ret(RET_EPERM))),
        )
        .chain(
            NOT_IMPLEMENTED
                .iter()
                .flat_map(|g| g.calls.iter())
                .filter(overridden)
                .map(|c| (c, Action::Ret(RET_ENOSYS))),
        )
        .chain(
            CONDITIONAL
                .iter()
                .map(|c| (&c.call, Action::Check(c.refuse)))
                .filter(|(c, _)| overridden(c)),
        );
    for (c, action) in named {
        let nr = u32::try_from(c.nr)
            .ok()
            .filter(|n| *n < X32_SYSCALL_BIT)
            .ok_or_else(|| {
                SysError::Other(format!("seccomp policy: bad number for {}", c.name()))
            })?;
        if actions.insert(nr, action).is_some() {
            return Err(SysError::Other(format!(
                "seccomp policy names {} twice",
                c.name()
            )));
        }
    }
    // Runs of equal action over 0..2^30; numbers no table names get ENOSYS.
    let mut runs: Vec<(u32, Action)> = Vec::new();
    let push = |start: u32, a: Action, runs: &mut Vec<(u32, Action)>| match runs.last() {
        Some((_, last)) if last.same(&a) => {}
        _ => runs.push((start, a)),
    };
    let mut next = 0u32;
    for (&nr, &a) in &actions {
        if nr > next {
            push(next, Action::Ret(RET_ENOSYS), &mut runs);
        }
        push(nr, a, &mut runs);
        next = nr + 1;
    }
    push(next, Action::Ret(RET_ENOSYS), &mut runs);

    let mut prog = vec![
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_ARCH),
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_NR),
        jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1),
        stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
    ];
    emit_tree(&runs, &mut prog)?;
    if prog.len() > 4096 {
        return Err(SysError::Other(format!(
            "seccomp program too long: {}",
            prog.len()
        )));
    }
    Ok(prog)
}
