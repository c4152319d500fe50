//! A global allocator that keeps the last freed blocks of cache-line-padded objects
//! (alignment 128 or more) allocated for a while before it frees them (ADR 0199).
//!
//! What it guards: the agent's event loop (tokio) uses the address of each socket or pipe
//! registration (`ScheduledIo`, `repr(align(128))` on x86_64 and aarch64) as its epoll
//! token. After a gVisor restore (runsc 20240729) epoll reports events for registrations
//! that were removed (`EPOLL_CTL_DEL` returned 0) and freed before the checkpoint; tokio
//! then writes through a freed pointer. Kept in this quarantine, such a block is still
//! a dropped registration with no waiters when the stale event arrives, and the event
//! wakes nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Blocks held at most (a registration is 256 bytes: ~1 MiB held).
const HELD: usize = 4096;
/// The alignment from which a block is quarantined.
const MIN_ALIGN: usize = 128;

struct Ring {
    blocks: [(usize, usize, usize); HELD],
    next: usize,
    len: usize,
}

/// The quarantine (exported as [`crate::alloc::Quarantine`]).
pub struct QuarantineAlloc {
    busy: AtomicBool,
    ring: UnsafeCell<Ring>,
}

// SAFETY: `ring` is only touched between a successful `busy` compare-exchange and its
// release (a spin lock), so at most one thread uses it at a time.
unsafe impl Sync for QuarantineAlloc {}

impl Default for QuarantineAlloc {
    fn default() -> Self {
        QuarantineAlloc::new()
    }
}

impl QuarantineAlloc {
    pub const fn new() -> QuarantineAlloc {
        QuarantineAlloc {
            busy: AtomicBool::new(false),
            ring: UnsafeCell::new(Ring {
                blocks: [(0, 0, 0); HELD],
                next: 0,
                len: 0,
            }),
        }
    }
}

// SAFETY: every block is allocated by `System` with the caller's layout and freed by
// `System` with the layout it was allocated with (kept beside it in the ring); a block
// in the ring is never handed out again before `System` frees it.
unsafe impl GlobalAlloc for QuarantineAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() < MIN_ALIGN {
            // SAFETY: `ptr` came from `System` with `layout` (every block does).
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // A quarantined kind of block moves by copy, so its old place goes through
        // `dealloc` (the quarantine) like any other free.
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `new_layout` has a non-zero size (the caller's contract for `realloc`).
        let new = unsafe { System.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are valid for the smaller of the two sizes and distinct.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            // SAFETY: `ptr` came from this allocator with `layout`, and is not used again.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.align() < MIN_ALIGN {
            // SAFETY: `ptr` came from `System` with `layout`.
            unsafe { System.dealloc(ptr, layout) };
            return;
        }
        while self
            .busy
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: the spin lock above is held: no other reference to the ring exists.
        let ring = unsafe { &mut *self.ring.get() };
        let evicted = if ring.len == HELD {
            Some(ring.blocks[ring.next])
        } else {
            ring.len += 1;
            None
        };
        ring.blocks[ring.next] = (ptr as usize, layout.size(), layout.align());
        ring.next = (ring.next + 1) % HELD;
        self.busy.store(false, Ordering::Release);
        if let Some((old, size, align)) = evicted {
            // `old` was quarantined with this size and alignment, a valid layout then.
            let Ok(layout) = Layout::from_size_align(size, align) else {
                return;
            };
            // SAFETY: `old` came from `System` with `layout` and has not been freed since.
            unsafe { System.dealloc(old as *mut u8, layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::QuarantineAlloc;
    use std::alloc::{GlobalAlloc, Layout};

    /// One block of `layout` from `q`, filled with `byte`.
    fn block(q: &QuarantineAlloc, layout: Layout, byte: u8) -> *mut u8 {
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { q.alloc(layout) };
        assert!(!p.is_null());
        // SAFETY: `p` is a fresh block of `layout.size()` bytes.
        unsafe { p.write_bytes(byte, layout.size()) };
        p
    }

    fn free(q: &QuarantineAlloc, p: *mut u8, layout: Layout) {
        // SAFETY: each caller frees a block of `q` once, with its own layout.
        unsafe { q.dealloc(p, layout) };
    }

    #[test]
    fn aligned_blocks_are_held_then_freed_and_others_pass_through() {
        let q = QuarantineAlloc::new();
        let big = Layout::from_size_align(256, 128).expect("layout");
        let small = Layout::from_size_align(64, 8).expect("layout");
        // More than the ring holds: the oldest are freed as new ones arrive.
        for _ in 0..5000 {
            let p = block(&q, big, 0xab);
            free(&q, p, big);
            let s = block(&q, small, 0);
            free(&q, s, small);
        }
        let p = block(&q, big, 0x5a);
        free(&q, p, big);
        let r = block(&q, big, 0);
        assert_ne!(r, p, "a quarantined block was handed out again");
        // SAFETY: `p` is still allocated by `System` (held in the ring), so reading it is
        // reading live memory; that it still says 0x5a is the point.
        assert_eq!(unsafe { *p }, 0x5a, "a quarantined block was written to");
        free(&q, r, big);
    }
}
