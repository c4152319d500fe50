//! The events of recent executions, kept by the agent so a client can re-attach
//! (`ContextAttach`): after it lost its connection, or after the daemon restarted (the
//! agent and its workers go on). Running executions are always kept; finished ones
//! while they fit in a small budget.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use threadbox_proto::{CodeEvent, Execution};
use tokio::sync::Notify;

/// Finished executions kept for re-attach, at most.
const KEEP_FINISHED: usize = 16;
/// Bytes of finished executions' events kept, at most (the newest first).
const KEEP_BYTES: usize = 32 * 1024 * 1024;

pub(crate) struct Journal {
    pub(crate) execution_id: String,
    pub(crate) context_id: String,
    pub(crate) events: RefCell<Vec<CodeEvent>>,
    pub(crate) done: RefCell<Option<Execution>>,
    bytes: Cell<usize>,
    /// Woken on each new event and at the end.
    pub(crate) changed: Notify,
}

fn event_bytes(ev: &CodeEvent) -> usize {
    match ev {
        CodeEvent::Stdout { text } | CodeEvent::Stderr { text } => text.len(),
        CodeEvent::Display(o) | CodeEvent::Result(o) => o
            .data
            .values()
            .map(|v| v.as_str().map_or(64, str::len))
            .sum::<usize>(),
        CodeEvent::Exception(e) => e.traceback.len() + e.value.len(),
        _ => 64,
    }
}

impl Journal {
    pub(crate) fn new(execution_id: String, context_id: String) -> Rc<Journal> {
        Rc::new(Journal {
            execution_id,
            context_id,
            events: RefCell::new(Vec::new()),
            done: RefCell::new(None),
            bytes: Cell::new(0),
            changed: Notify::new(),
        })
    }

    pub(crate) fn push(&self, ev: CodeEvent) {
        self.bytes.set(self.bytes.get() + event_bytes(&ev));
        self.events.borrow_mut().push(ev);
        self.changed.notify_waiters();
    }

    pub(crate) fn finish(&self, ex: Execution) {
        *self.done.borrow_mut() = Some(ex);
        self.changed.notify_waiters();
    }
}

#[derive(Default)]
pub(crate) struct Journals {
    list: VecDeque<Rc<Journal>>,
}

impl Journals {
    pub(crate) fn add(&mut self, j: Rc<Journal>) {
        self.list.push_back(j);
        self.trim();
    }

    pub(crate) fn get(&self, execution_id: &str) -> Option<Rc<Journal>> {
        self.list
            .iter()
            .find(|j| j.execution_id == execution_id)
            .cloned()
    }

    /// Forgets the oldest finished executions beyond the budget.
    pub(crate) fn trim(&mut self) {
        let mut kept = 0usize;
        let mut bytes = 0usize;
        let mut keep = vec![true; self.list.len()];
        for (i, j) in self.list.iter().enumerate().rev() {
            if j.done.borrow().is_none() {
                continue;
            }
            kept += 1;
            bytes += j.bytes.get();
            // The newest finished one is kept whatever its size.
            if kept > KEEP_FINISHED || (kept > 1 && bytes > KEEP_BYTES) {
                keep[i] = false;
            }
        }
        let mut i = 0;
        self.list.retain(|_| {
            i += 1;
            keep[i - 1]
        });
    }
}
