//! The assumption monitor: a run that claims "the lock
//! holds when its assumptions hold" is evidence only if no process was
//! starved. A thread that asks to wake every millisecond records how late it
//! woke; lateness beyond the bound marks the run invalid (to re-run), not
//! failed, because a 2-core machine under load can starve any process.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A running lateness monitor; stops when dropped.
#[derive(Debug)]
pub struct Monitor {
    worst_us: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Monitor {
    /// Starts ticking every millisecond on a thread of its own.
    pub fn start() -> Monitor {
        let worst_us = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (worst, stopped) = (Arc::clone(&worst_us), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("assumption-monitor".into())
            .spawn(move || {
                let tick = Duration::from_millis(1);
                while !stopped.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    std::thread::sleep(tick);
                    let late = asked.elapsed().saturating_sub(tick);
                    worst.fetch_max(
                        u64::try_from(late.as_micros()).unwrap_or(u64::MAX),
                        Ordering::Relaxed,
                    );
                }
            })
            .expect("spawn the monitor thread");
        Monitor { worst_us, stop }
    }

    /// The worst lateness seen so far.
    pub fn worst(&self) -> Duration {
        Duration::from_micros(self.worst_us.load(Ordering::Relaxed))
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The starvation bound: half the lock's drift allowance δ for a
/// lease of `ttl` (ttl/100 + 2 ms).
pub fn bound(ttl: Duration) -> Duration {
    (ttl / 100 + Duration::from_millis(2)) / 2
}
