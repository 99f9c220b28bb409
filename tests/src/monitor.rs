//! The assumption monitor: a run that claims "the lock
//! holds when its assumptions hold" is evidence only if no process was
//! starved. A thread that asks to wake every millisecond records how late it
//! woke; lateness beyond the bound marks the run invalid (to re-run), not
//! failed, because a 2-core machine under load can starve any process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running lateness monitor; stops when dropped.
#[derive(Debug)]
pub struct Monitor {
    worst_us: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    started: Instant,
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
        children_watch();
        Monitor {
            worst_us,
            stop,
            started: Instant::now(),
        }
    }

    /// The worst lateness seen so far.
    pub fn worst(&self) -> Duration {
        Duration::from_micros(self.worst_us.load(Ordering::Relaxed))
    }

    /// Whether a lease of `ttl` could have been lost to starvation while
    /// this monitor ran: this process late past [`bound`]`(ttl)`, or a
    /// server or worker it spawned kept from a CPU for a quarter of the
    /// lease within a second (its answers, a renewal's among them, came
    /// that late).
    pub fn starved_for(&self, ttl: Duration) -> bool {
        self.worst() > bound(ttl) || self.children_worst() > ttl / 4
    }

    /// The most a thread of a process this one spawned (a server, a
    /// worker) waited, runnable, for a CPU within one second, since this
    /// monitor started: see [`watch_process`].
    pub fn children_worst(&self) -> Duration {
        children_watch().worst_since(self.started)
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

    /// The children's watch since this one started: see
    /// [`Monitor::children_worst`].
    pub fn children_worst(&self) -> Duration {
        self.thread.children_worst()
    }
}

/// The starvation bound: half the lock's drift allowance δ for a
/// lease of `ttl` (ttl/100 + 2 ms).
pub fn bound(ttl: Duration) -> Duration {
    (ttl / 100 + Duration::from_millis(2)) / 2
}

/// The processes this one spawned (servers, workers, holders), whose
/// scheduling [`Monitor::children_worst`] reads. A server starved of CPU
/// answers late, and this process's own monitors cannot see it: a CPU-hog
/// run lost a renewed PostgreSQL lease while this process was never more
/// than 3.3 ms late.
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Has the children's watch read process `pid`'s scheduling (and its
/// threads' and child processes', as PostgreSQL's backends are).
pub fn watch_process(pid: u32) {
    CHILDREN.lock().expect("children").push(pid);
}

/// How often the children's watch reads their scheduling: the kernel adds
/// up each wait, so a sample only says when; 20 a second cost a ZooKeeper
/// server's 40 threads 800 reads a second.
const CHILDREN_SAMPLE: Duration = Duration::from_millis(50);

/// The window a thread's waits are added up over.
const WAITS_WINDOW: Duration = Duration::from_secs(1);

/// How many stalls the watch remembers (one per sample at most: minutes).
const STALLS_KEPT: usize = 20_000;

/// One process-wide thread that reads, every 50 ms, how long each thread
/// of the watched processes has waited runnable for a CPU
/// (`/proc/<pid>/task/<tid>/schedstat`, its second field), and adds up
/// each thread's waits over the last second. The kernel adds a wait when
/// the thread gets a CPU: a thread kept waiting 600 ms shows it in one
/// sample, and one of four sharing a CPU waits about 750 ms in every
/// second. No crate reads per-thread schedstat, hence by hand.
struct ChildrenWatch {
    /// (when, the most any thread waited in the second before) whenever
    /// that was above 1 ms, oldest first.
    stalls: Mutex<std::collections::VecDeque<(Instant, Duration)>>,
}

impl ChildrenWatch {
    fn worst_since(&self, since: Instant) -> Duration {
        let stalls = self.stalls.lock().expect("stalls");
        stalls
            .iter()
            .rev()
            .take_while(|(at, _)| *at >= since)
            .map(|(_, stall)| *stall)
            .max()
            .unwrap_or_default()
    }
}

fn children_watch() -> &'static ChildrenWatch {
    static WATCH: ChildrenWatch = ChildrenWatch {
        stalls: Mutex::new(std::collections::VecDeque::new()),
    };
    static SAMPLING: std::sync::Once = std::sync::Once::new();
    SAMPLING.call_once(|| {
        std::thread::Builder::new()
            .name("children-watch".into())
            .spawn(|| sample_children(&WATCH))
            .expect("spawn the children's watch");
    });
    &WATCH
}

/// Per thread: its wait total at the last sample, and the waits it added
/// in the last [`WAITS_WINDOW`] with their sum.
#[derive(Default)]
struct ThreadWaits {
    total_ns: u64,
    recent: std::collections::VecDeque<(Instant, Duration)>,
    in_window: Duration,
}

fn sample_children(watch: &'static ChildrenWatch) {
    let mut threads: HashMap<(u32, u32), ThreadWaits> = HashMap::new();
    loop {
        std::thread::sleep(CHILDREN_SAMPLE);
        let now = Instant::now();
        let roots = CHILDREN.lock().expect("children").clone();
        let running = processes_under(&roots);
        // Forget the processes that ended (workers come and go).
        CHILDREN
            .lock()
            .expect("children")
            .retain(|pid| running.contains(pid) || !roots.contains(pid));
        let mut seen = HashMap::with_capacity(threads.len());
        let mut worst = Duration::ZERO;
        for pid in running {
            for (tid, total_ns) in thread_waits(pid) {
                let mut waits = threads.remove(&(pid, tid)).unwrap_or(ThreadWaits {
                    total_ns,
                    ..ThreadWaits::default()
                });
                let waited = Duration::from_nanos(total_ns.saturating_sub(waits.total_ns));
                waits.total_ns = total_ns;
                if !waited.is_zero() {
                    waits.recent.push_back((now, waited));
                    waits.in_window += waited;
                }
                while let Some(&(at, old)) = waits.recent.front()
                    && now - at > WAITS_WINDOW
                {
                    waits.in_window -= old;
                    waits.recent.pop_front();
                }
                worst = worst.max(waits.in_window);
                seen.insert((pid, tid), waits);
            }
        }
        threads = seen;
        if worst > Duration::from_millis(1) {
            let mut stalls = watch.stalls.lock().expect("stalls");
            if stalls.len() == STALLS_KEPT {
                stalls.pop_front();
            }
            stalls.push_back((now, worst));
        }
    }
}

/// `roots` and every process below them that is still running.
fn processes_under(roots: &[u32]) -> Vec<u32> {
    let mut all = Vec::new();
    let mut next: Vec<u32> = roots.to_vec();
    while let Some(pid) = next.pop() {
        // The main thread's children: the servers here fork from it
        // (PostgreSQL's backends), and reading every thread's would cost a
        // read per thread per sample. The read fails once `pid` is gone.
        let Ok(children) = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) else {
            continue;
        };
        all.push(pid);
        next.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
    }
    all
}

/// Each thread of `pid` with its total wait for a CPU, in ns.
fn thread_waits(pid: u32) -> Vec<(u32, u64)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let tid = task.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            let waited = stat.split_whitespace().nth(1)?.parse().ok()?;
            Some((tid, waited))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn spawn(program: &str, args: &[&str]) -> std::process::Child {
        let mut command = Command::new(program);
        command.args(args).stdout(Stdio::null()).stderr(Stdio::null());
        crate::server::spawn_owned(command).expect("spawn")
    }

    /// A child that sleeps never waits for a CPU; four busy children
    /// pinned to one CPU each wait three quarters of the time.
    #[test]
    fn the_childrens_watch_sees_a_child_kept_from_the_cpu() {
        let monitor = Monitor::start();
        let mut sleeper = spawn("sleep", &["30"]);
        // A window to measure in, not a synchronisation.
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            monitor.children_worst() < Duration::from_millis(100),
            "a sleeping child was seen stalled {:?}",
            monitor.children_worst()
        );
        let mut busy: Vec<_> = (0..4).map(|_| spawn("yes", &[])).collect();
        let mut one_cpu = nix::sched::CpuSet::new();
        one_cpu.set(0).expect("cpu 0");
        for child in &busy {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
            nix::sched::sched_setaffinity(pid, &one_cpu).expect("pin to cpu 0");
        }
        let began = Instant::now();
        while monitor.children_worst() < Duration::from_millis(100)
            && began.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(CHILDREN_SAMPLE);
        }
        let seen = monitor.children_worst();
        for child in busy.iter_mut().chain([&mut sleeper]) {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert!(
            seen >= Duration::from_millis(100),
            "four children sharing one CPU for {:?}: worst stall seen {seen:?}",
            began.elapsed()
        );
    }
}
