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

/// The same watch from inside a tokio runtime: a task that asks to wake
/// every millisecond. The thread monitor sees a process starved; this one
/// also sees its runtime's worker threads fall behind (every worker busy,
/// or runnable but not running while the monitor's sleeping thread is
/// woken first), which is when a lock's deadline timer fires late and a
/// body runs past its lease. Stops when dropped.
#[derive(Debug)]
pub struct RuntimeMonitor {
    worst_us: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl RuntimeMonitor {
    /// Starts ticking on the current runtime. Tokio's timer counts whole
    /// milliseconds, so a tick may come up to a millisecond late with
    /// nothing wrong: that much is not counted.
    pub fn start() -> RuntimeMonitor {
        let worst_us = Arc::new(AtomicU64::new(0));
        let worst = Arc::clone(&worst_us);
        let task = tokio::spawn(async move {
            let tick = Duration::from_millis(1);
            loop {
                let asked = Instant::now();
                tokio::time::sleep(tick).await;
                let late = asked.elapsed().saturating_sub(2 * tick);
                worst.fetch_max(
                    u64::try_from(late.as_micros()).unwrap_or(u64::MAX),
                    Ordering::Relaxed,
                );
            }
        });
        RuntimeMonitor { worst_us, task }
    }

    /// The worst lateness seen so far.
    pub fn worst(&self) -> Duration {
        Duration::from_micros(self.worst_us.load(Ordering::Relaxed))
    }
}

impl Drop for RuntimeMonitor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Both watches at once, for a test that times a holder's stop on its own
/// runtime: the process starved (the thread monitor) or its runtime's
/// workers behind (the runtime monitor) both make a late stop unjudgeable.
/// Stops when dropped.
#[derive(Debug)]
pub struct Watch {
    thread: Monitor,
    runtime: RuntimeMonitor,
}

impl Watch {
    /// Starts both monitors; the runtime one on the current runtime.
    pub fn start() -> Watch {
        Watch {
            thread: Monitor::start(),
            runtime: RuntimeMonitor::start(),
        }
    }

    /// The worse of the two monitors' worst lateness.
    pub fn worst(&self) -> Duration {
        self.thread.worst().max(self.runtime.worst())
    }
}

/// The starvation bound: half the lock's drift allowance δ for a
/// lease of `ttl` (ttl/100 + 2 ms).
pub fn bound(ttl: Duration) -> Duration {
    (ttl / 100 + Duration::from_millis(2)) / 2
}
