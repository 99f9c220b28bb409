//! The bench's allocator: the system's, counted only while W1a measures.
//!
//! Counting (`stats_alloc`) costs every allocation a few atomic increments
//! on one shared cache line. Left on for the whole run, it cost the
//! in-process pair (W1m) 300 ns of its 1,545, and it made the cores contend
//! for that line in the many-task workloads, charging the side that
//! allocates more (the library) for the bench's own bookkeeping. No kept
//! crate switches its counting on and off, so this wrapper does: a relaxed
//! load of one flag that nothing writes while a workload runs.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};

use stats_alloc::{INSTRUMENTED_SYSTEM, Stats};

static COUNTING: AtomicBool = AtomicBool::new(false);

/// The system allocator, through `stats_alloc` while counting is on.
pub(crate) struct CountedWhenAsked;

// SAFETY: both paths are the system allocator (`stats_alloc` counts, then
// calls `System`), so a block allocated on one path may be freed or
// reallocated on the other; every call is forwarded with its arguments
// unchanged, under the caller's guarantees.
unsafe impl GlobalAlloc for CountedWhenAsked {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            unsafe { INSTRUMENTED_SYSTEM.alloc(layout) }
        } else {
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if COUNTING.load(Ordering::Relaxed) {
            unsafe { INSTRUMENTED_SYSTEM.dealloc(ptr, layout) }
        } else {
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            unsafe { INSTRUMENTED_SYSTEM.alloc_zeroed(layout) }
        } else {
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            unsafe { INSTRUMENTED_SYSTEM.realloc(ptr, layout, new_size) }
        } else {
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }
}

/// Starts counting; the counts so far, to subtract from [`stop`]'s.
pub(crate) fn start() -> Stats {
    COUNTING.store(true, Ordering::Relaxed);
    INSTRUMENTED_SYSTEM.stats()
}

/// Stops counting; the counts so far.
pub(crate) fn stop() -> Stats {
    COUNTING.store(false, Ordering::Relaxed);
    INSTRUMENTED_SYSTEM.stats()
}
