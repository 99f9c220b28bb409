//! The checker of the fault suite: what really happened, observed without
//! trusting the lock.
//!
//! Every process of a run maps one shared-memory board and keeps, per key, an
//! occupancy counter changed with atomics on enter and exit (a body entering
//! where another is inside is an overlap), a read-modify-write counter that
//! loses updates when bodies overlap, and a fenced register that refuses
//! stale tokens. Atomics are ordered by the hardware, not by message delivery,
//! so a reported overlap is real and none can be missed: ENTER counts before
//! it is logged and EXIT is logged before it uncounts, so the recorded
//! interval is inside the true one.
//!
//! Every process also appends fixed-size records (holder, token, enter, exit,
//! lost, faults) to a log of its own, one `write(2)` each so that a record
//! survives `kill -9`, stamped with the raw monotonic clock that all processes
//! of the machine share. [`analyze`] reads the logs afterwards for what the
//! online counters cannot say: overlap durations, token order, lost-signal
//! slack and the time from each fault's heal to the next entry.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const BOARD: &str = "board";
const SLOTS: usize = 1024;
const WORDS_PER_SLOT: usize = 16;
/// Word 0 of the board is the global sequence; slots start one line later.
const HEADER_WORDS: usize = 8;
const RECORD: usize = 64;

// Slot layout, one u64 each.
const KEY: usize = 0;
const OCCUPANCY: usize = 1;
const ENTRIES: usize = 2;
const OVERLAPS: usize = 3;
const COUNTER: usize = 4;
const MAX_TOKEN: usize = 5;
const STALE_REJECTED: usize = 6;
const STALE_ACCEPTED: usize = 7;
const BUMPED: usize = 8;

/// What a log record says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u64)]
pub enum Kind {
    /// A holder's body started (outermost acquisitions only).
    Enter = 1,
    /// The body ended.
    Exit = 2,
    /// The body ended because its lock was lost; `detail` is its deadline D.
    Lost = 3,
    /// A fenced write was refused as stale.
    FenceRejected = 5,
    /// The controller began a fault; `detail` is its index in [`FAULTS`].
    Fault = 6,
    /// The controller healed the fault.
    Heal = 7,
    /// A call for a fair lock ended (granted: its `Enter`, with the same
    /// holder, follows; else it gave up): `token` is when it started,
    /// `detail` when its first answer made it wait (0: it never waited).
    Call = 8,
}

/// Names of the faults the controller logs, by index.
pub const FAULTS: &[&str] = &[
    "server-sigstop",
    "debug-sleep",
    "client-pause",
    "proxy-delay",
    "proxy-blackhole",
    "client-kill",
    "script-flush",
    "kill-restart-aof",
    "proxy-reset",
    "kill-restart-delayed",
    "proxy-throttle",
    "eviction",
    "kill-restart-empty",
    "master-sigkill",
    "server-kill-restart",
    "member-kill-restart",
];

/// The raw `CLOCK_MONOTONIC` in nanoseconds: the same clock in every process
/// of the machine, and it keeps running while a process is stopped.
pub fn now_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("monotonic clock");
    u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec()).unwrap_or(0)
}

/// `at` on the raw monotonic clock (std's `Instant` hides its value).
pub fn instant_ns(at: Instant) -> u64 {
    let (now, now_ns) = (Instant::now(), now_ns());
    if at >= now {
        now_ns + u64::try_from((at - now).as_nanos()).unwrap_or(u64::MAX)
    } else {
        now_ns.saturating_sub(u64::try_from((now - at).as_nanos()).unwrap_or(u64::MAX))
    }
}

/// A key's slot name on the board and in the logs (never 0).
pub fn key_id(key: &str) -> u64 {
    // FNV-1a: stable across processes and builds, unlike std's hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    hash | 1
}

/// How a body shares its key: it takes `weight` of the key's `capacity`,
/// and an entry that finds the key fuller than `capacity - weight` is an
/// overlap. An exclusive holder is 1 of 1; a reader 1 of [`Share::WRITER`]
/// and a writer all of it, so that a writer beside anyone, or a reader
/// beside a writer, overflows; a permit holder is 1 of N.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// What this body takes.
    pub weight: u64,
    /// What the key holds.
    pub capacity: u64,
}

impl Share {
    /// The weight of a writer, and the capacity of a read-write key.
    const WHOLE: u64 = 1 << 32;
    /// An exclusive holder.
    pub const EXCLUSIVE: Share = Share {
        weight: 1,
        capacity: 1,
    };
    /// A reader of a read-write lock.
    pub const READER: Share = Share {
        weight: 1,
        capacity: Self::WHOLE,
    };
    /// The writer of a read-write lock.
    pub const WRITER: Share = Share {
        weight: Self::WHOLE,
        capacity: Self::WHOLE,
    };

    /// One of `n` permits.
    pub fn permit(n: u64) -> Share {
        Share {
            weight: 1,
            capacity: n,
        }
    }
}

/// One process's view of a run's checker; cheap to clone.
#[derive(Clone)]
pub struct Witness {
    board: Arc<memmap2::MmapMut>,
    log: Arc<File>,
    dir: PathBuf,
}

impl std::fmt::Debug for Witness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Witness({})", self.dir.display())
    }
}

/// What the board saw for one key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    /// Bodies that entered.
    pub entries: u64,
    /// Entries made while another body was inside.
    pub overlaps: u64,
    /// The read-modify-write counter: equals `bumped` unless updates were
    /// lost.
    pub counter: u64,
    /// Bumps that completed (a body stopped between a bump's read and its
    /// write, when its lease was lost, wrote nothing and is not counted).
    pub bumped: u64,
    /// Stale tokens the fenced register refused.
    pub stale_rejected: u64,
    /// Stale tokens an unfenced register accepted.
    pub stale_accepted: u64,
}

impl Seen {
    /// Completed bumps whose increment another body overwrote: each one a
    /// write the lock failed to protect.
    pub fn lost_updates(&self) -> u64 {
        self.bumped - self.counter.min(self.bumped)
    }
}

impl Witness {
    /// Creates a run's board in `dir` (a fresh directory) and opens it.
    pub fn create(dir: &Path) -> std::io::Result<Witness> {
        let board = File::create(dir.join(BOARD))?;
        board.set_len(((HEADER_WORDS + SLOTS * WORDS_PER_SLOT) * 8) as u64)?;
        Self::open(dir)
    }

    /// Opens the board another process created, with a log of this process's own.
    pub fn open(dir: &Path) -> std::io::Result<Witness> {
        let file = OpenOptions::new().read(true).write(true).open(dir.join(BOARD))?;
        let board = map(&file)?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("log-{}-{}", std::process::id(), now_ns())))?;
        Ok(Witness {
            board: Arc::new(board),
            log: Arc::new(log),
            dir: dir.to_owned(),
        })
    }

    /// The run's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn words(&self) -> &[AtomicU64] {
        let bytes: &[u8] = &self.board;
        // SAFETY: the mapping is page-aligned and a whole number of u64s long,
        // lives as long as `self`, and every process touches it only through
        // atomics, so viewing it as `AtomicU64`s is sound.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(bytes.as_ptr().cast::<AtomicU64>(), bytes.len() / 8)
        }
    }

    fn slot(&self, key: &str) -> &[AtomicU64] {
        let id = key_id(key);
        let words = self.words();
        let start = usize::try_from(id % SLOTS as u64).unwrap_or(0);
        for probe in 0..SLOTS {
            let at = HEADER_WORDS + ((start + probe) % SLOTS) * WORDS_PER_SLOT;
            let slot = &words[at..at + WORDS_PER_SLOT];
            match slot[KEY].compare_exchange(0, id, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return slot,
                Err(existing) if existing == id => return slot,
                Err(_) => {}
            }
        }
        panic!("the witness board is full ({SLOTS} keys)");
    }

    fn append(&self, kind: Kind, holder: u64, key: u64, token: u64, seq: u64, detail: u64) {
        let mut record = [0u8; RECORD];
        let fields = [
            kind as u64,
            u64::from(std::process::id()),
            holder,
            key,
            token,
            seq,
            now_ns(),
            detail,
        ];
        for (chunk, field) in record.chunks_exact_mut(8).zip(fields) {
            chunk.copy_from_slice(&field.to_le_bytes());
        }
        // One write per record on an O_APPEND file: records from a process
        // killed mid-run are whole or absent, never torn or interleaved.
        (&*self.log)
            .write_all(&record)
            .expect("append to the witness log");
    }

    /// A holder's body starts. Count first, then log.
    pub fn enter(&self, key: &str, holder: u64, token: u64) {
        self.enter_shared(key, holder, token, Share::EXCLUSIVE);
    }

    /// A body that takes `share` of its key starts. Shared entries are
    /// checked on the board only: the logs' interval analysis knows
    /// exclusive locks alone.
    pub fn enter_shared(&self, key: &str, holder: u64, token: u64, share: Share) {
        let slot = self.slot(key);
        let seq = self.words()[0].fetch_add(1, Ordering::SeqCst);
        let before = slot[OCCUPANCY].fetch_add(share.weight, Ordering::SeqCst);
        if before + share.weight > share.capacity {
            slot[OVERLAPS].fetch_add(1, Ordering::SeqCst);
        }
        slot[ENTRIES].fetch_add(1, Ordering::SeqCst);
        if share == Share::EXCLUSIVE {
            self.append(Kind::Enter, holder, key_id(key), token, seq, 0);
        }
    }

    /// The body ends. Log first, then uncount.
    pub fn exit(&self, key: &str, holder: u64, token: u64) {
        self.leave(key, Kind::Exit, holder, token, 0, Share::EXCLUSIVE);
    }

    /// A body that took `share` of its key ends (or is stopped).
    pub fn exit_shared(&self, key: &str, holder: u64, token: u64, share: Share) {
        self.leave(key, Kind::Exit, holder, token, 0, share);
    }

    /// The body ends because its lock was lost, with validity deadline `deadline`.
    pub fn lost(&self, key: &str, holder: u64, token: u64, deadline: Instant) {
        self.leave(
            key,
            Kind::Lost,
            holder,
            token,
            instant_ns(deadline),
            Share::EXCLUSIVE,
        );
    }

    fn leave(&self, key: &str, kind: Kind, holder: u64, token: u64, detail: u64, share: Share) {
        let slot = self.slot(key);
        let seq = self.words()[0].fetch_add(1, Ordering::SeqCst);
        if share == Share::EXCLUSIVE {
            self.append(kind, holder, key_id(key), token, seq, detail);
        }
        slot[OCCUPANCY].fetch_sub(share.weight, Ordering::SeqCst);
    }

    /// Reads the counter, yields, writes it back plus one: the write a lock
    /// protects, and which overlapping bodies lose.
    pub async fn bump(&self, key: &str) {
        let seen = self.slot(key)[COUNTER].load(Ordering::SeqCst);
        tokio::task::yield_now().await;
        self.slot(key)[COUNTER].store(seen + 1, Ordering::SeqCst);
        self.slot(key)[BUMPED].fetch_add(1, Ordering::SeqCst);
    }

    /// Writes to the register of `key` with a fencing token; `fenced` makes
    /// the register refuse tokens lower than the highest it has applied (equal
    /// ones are the same holder again). Returns whether the write applied.
    pub fn write(&self, key: &str, token: u64, fenced: bool) -> bool {
        let slot = self.slot(key);
        let mut max = slot[MAX_TOKEN].load(Ordering::SeqCst);
        loop {
            if token < max {
                let seq = self.words()[0].fetch_add(1, Ordering::SeqCst);
                self.append(Kind::FenceRejected, 0, key_id(key), token, seq, max);
                if fenced {
                    slot[STALE_REJECTED].fetch_add(1, Ordering::SeqCst);
                    return false;
                }
                slot[STALE_ACCEPTED].fetch_add(1, Ordering::SeqCst);
                return true;
            }
            match slot[MAX_TOKEN].compare_exchange(max, token, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return true,
                Err(now) => max = now,
            }
        }
    }

    /// The highest token the register of `key` has taken.
    pub fn register_max(&self, key: &str) -> u64 {
        self.slot(key)[MAX_TOKEN].load(Ordering::SeqCst)
    }

    /// A call for a fair lock on `key` ended, before its body (if it got
    /// the lock) enters with the same `holder`. It started at `started`
    /// and was first told to wait at `waited` (`None`: it never waited).
    pub fn call(&self, key: &str, holder: u64, started: u64, waited: Option<u64>) {
        self.append(Kind::Call, holder, key_id(key), started, 0, waited.unwrap_or(0));
    }

    /// The controller logs a fault (one of [`FAULTS`]) beginning.
    pub fn fault(&self, fault: &str) {
        self.append(Kind::Fault, 0, 0, 0, 0, fault_index(fault));
    }

    /// The controller logs the fault healed.
    pub fn heal(&self, fault: &str) {
        self.append(Kind::Heal, 0, 0, 0, 0, fault_index(fault));
    }

    /// Everything the board saw for `key`.
    pub fn seen(&self, key: &str) -> Seen {
        let slot = self.slot(key);
        let v = |i: usize| slot[i].load(Ordering::SeqCst);
        Seen {
            entries: v(ENTRIES),
            overlaps: v(OVERLAPS),
            counter: v(COUNTER),
            bumped: v(BUMPED),
            stale_rejected: v(STALE_REJECTED),
            stale_accepted: v(STALE_ACCEPTED),
        }
    }
}

fn fault_index(fault: &str) -> u64 {
    FAULTS
        .iter()
        .position(|f| *f == fault)
        .unwrap_or_else(|| panic!("`{fault}` is not in witness::FAULTS")) as u64
}

fn map(file: &File) -> std::io::Result<memmap2::MmapMut> {
    // SAFETY: the board file is created for one run in a private temporary
    // directory, is never truncated while mapped, and is only accessed
    // through atomics (see `Witness::words`).
    #[allow(unsafe_code)]
    unsafe {
        memmap2::MmapMut::map_mut(file)
    }
}

/// One log record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// What happened.
    pub kind: Kind,
    /// The process that logged it.
    pub pid: u32,
    /// The holder (unique within its process).
    pub holder: u64,
    /// [`key_id`] of the key, 0 for controller records.
    pub key: u64,
    /// The fencing token, 0 without one.
    pub token: u64,
    /// Position in the board's global order of enters and exits.
    pub seq: u64,
    /// When, on the raw monotonic clock.
    pub at: u64,
    /// Deadline (Lost), fault index (Fault, Heal), max token (FenceRejected),
    /// first told to wait (Call).
    pub detail: u64,
}

/// Every record of a run, ordered by time.
pub fn read_logs(dir: &Path) -> std::io::Result<Vec<Record>> {
    let mut records = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if !path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("log-"))
        {
            continue;
        }
        let bytes = std::fs::read(&path)?;
        for raw in bytes.chunks_exact(RECORD) {
            let field = |i: usize| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            let kind = match field(0) {
                1 => Kind::Enter,
                2 => Kind::Exit,
                3 => Kind::Lost,
                5 => Kind::FenceRejected,
                6 => Kind::Fault,
                7 => Kind::Heal,
                8 => Kind::Call,
                other => panic!("corrupt witness record kind {other} in {}", path.display()),
            };
            records.push(Record {
                kind,
                pid: u32::try_from(field(1)).unwrap_or(0),
                holder: field(2),
                key: field(3),
                token: field(4),
                seq: field(5),
                at: field(6),
                detail: field(7),
            });
        }
    }
    records.sort_by_key(|r| (r.at, r.seq));
    Ok(records)
}

/// Two bodies inside one key's critical section at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// The key's name, or its id in hex when not among the names given.
    pub key: String,
    /// How long both were inside.
    pub duration: Duration,
    /// When the later one entered.
    pub at: u64,
}

/// What the logs of a run show.
#[derive(Debug, Clone, Default)]
pub struct Analysis {
    /// Bodies entered (outermost acquisitions).
    pub entries: u64,
    /// Every overlap of two bodies on one key.
    pub overlaps: Vec<Overlap>,
    /// Entries whose token was not above the previous entry's on the same key.
    pub token_regressions: u64,
    /// Entries with no exit and no lost.
    pub unmatched: u64,
    /// `D − t_lost` of every body that ended on a lost lock, in ns (negative:
    /// it noticed after its deadline).
    pub lost_slack_ns: Vec<i64>,
    /// Faults the controller logged.
    pub faults: u64,
    /// Faults per kind.
    pub faults_by_kind: BTreeMap<&'static str, u64>,
    /// For each heal followed by an entry: time to the first entry on a key
    /// after the heal, or after the body inside at the heal left, in ns.
    pub heal_to_entry_ns: Vec<u64>,
    /// Heals after which no body entered before the run ended.
    pub heals_without_entry: u64,
    /// Pairs of fair calls on one key where the first was in line before
    /// the second started, and still waiting then, away from any fault:
    /// the pairs whose order the analysis judged.
    pub fair_pairs: u64,
    /// Of those, the second got the lock first.
    pub fair_out_of_order: u64,
}

/// How long after a fault heals a fair call's place in line is still
/// allowed to have been lost in it: a place lives
/// `fair_waiter_timeout` (2 s) unrenewed, and a call renews it on its next
/// answer, which may come only once its connection is back.
const PLACE_GRACE: Duration = Duration::from_secs(3);

/// One fair call, from the logs.
struct FairCall {
    started: u64,
    waited: u64,
    ended: u64,
    entered: Option<u64>,
}

/// A process stopped (SIGSTOP) by the controller from `from` to `to`, on
/// the raw monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pause {
    /// The stopped process.
    pub pid: u32,
    /// Seen stopped.
    pub from: u64,
    /// Continued.
    pub to: u64,
}

/// Reads a run's logs and checks them. `keys` names the
/// key ids in the overlaps it reports.
pub fn analyze(dir: &Path, keys: &[&str]) -> std::io::Result<Analysis> {
    analyze_with_pauses(dir, keys, &[])
}

/// [`analyze`], for a run in which the controller stopped processes: a
/// stopped process cannot be told anything, so a body lost while its
/// process was stopped at the body's validity deadline is judged to have
/// ended at that deadline (what it does later is for fencing to stop), not
/// when it noticed. Every other body ends when it noticed.
pub fn analyze_with_pauses(dir: &Path, keys: &[&str], pauses: &[Pause]) -> std::io::Result<Analysis> {
    let records = read_logs(dir)?;
    let names: BTreeMap<u64, &str> = keys.iter().map(|k| (key_id(k), *k)).collect();
    let name = |id: u64| {
        names
            .get(&id)
            .map_or_else(|| format!("{id:#x}"), |n| (*n).to_owned())
    };
    let mut analysis = Analysis::default();

    // Intervals per key: (enter, exit) of each holder.
    let mut open: BTreeMap<(u32, u64, u64), Record> = BTreeMap::new();
    let mut intervals: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    let mut last_token: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for r in &records {
        match r.kind {
            Kind::Enter => {
                analysis.entries += 1;
                open.insert((r.pid, r.holder, r.key), *r);
                if r.token != 0 {
                    // Tokens in the board's global order of entries.
                    if let Some(&(seq, previous)) = last_token.get(&r.key)
                        && seq < r.seq
                        && r.token <= previous
                    {
                        analysis.token_regressions += 1;
                    }
                    last_token.insert(r.key, (r.seq, r.token));
                }
            }
            Kind::Exit | Kind::Lost => {
                let stopped_at_deadline = r.kind == Kind::Lost
                    && r.detail < r.at
                    && pauses
                        .iter()
                        .any(|p| p.pid == r.pid && p.from <= r.detail && r.detail <= p.to);
                let ended = if stopped_at_deadline { r.detail } else { r.at };
                if let Some(enter) = open.remove(&(r.pid, r.holder, r.key)) {
                    intervals.entry(r.key).or_default().push((enter.at, ended));
                }
                if r.kind == Kind::Lost {
                    analysis
                        .lost_slack_ns
                        .push(i64::try_from(r.detail).unwrap_or(i64::MAX) - i64::try_from(r.at).unwrap_or(0));
                }
            }
            Kind::Fault => {
                analysis.faults += 1;
                let fault = FAULTS
                    .get(usize::try_from(r.detail).unwrap_or(usize::MAX))
                    .copied();
                *analysis
                    .faults_by_kind
                    .entry(fault.unwrap_or("unknown"))
                    .or_default() += 1;
            }
            _ => {}
        }
    }
    analysis.unmatched = open.len() as u64;
    for spans in intervals.values_mut() {
        spans.sort_unstable();
    }
    for (&key, spans) in &intervals {
        let mut latest_exit = 0;
        for &(enter, exit) in spans {
            if enter < latest_exit {
                analysis.overlaps.push(Overlap {
                    key: name(key),
                    duration: Duration::from_nanos(latest_exit.min(exit) - enter),
                    at: enter,
                });
            }
            latest_exit = latest_exit.max(exit);
        }
    }
    // Liveness after a heal: on each key, from the heal or, if a body was
    // inside then, from when it left (a lock legitimately held is not a
    // stall), to the next entry; the heal counts as followed by progress at
    // the first key that shows it.
    for heal in records.iter().filter(|r| r.kind == Kind::Heal) {
        let progress = intervals
            .values()
            .filter_map(|spans| {
                let free_from = spans
                    .iter()
                    .filter(|(enter, exit)| *enter <= heal.at && *exit > heal.at)
                    .map(|&(_, exit)| exit)
                    .max()
                    .unwrap_or(heal.at);
                let next = spans.iter().find(|(enter, _)| *enter >= free_from)?;
                Some(next.0 - free_from)
            })
            .min();
        match progress {
            Some(wait) => analysis.heal_to_entry_ns.push(wait),
            None => analysis.heals_without_entry += 1,
        }
    }
    let (pairs, out_of_order) = fair_order(&records);
    analysis.fair_pairs = pairs;
    analysis.fair_out_of_order = out_of_order;
    Ok(analysis)
}

/// Judges arrival order on fair locks: when call A was told to wait before
/// call B started, and A was still waiting when B's body entered, B went
/// first: out of order. A waiter is only live while nothing fails around
/// it, so a pair whose span (A first waiting to B's entry) meets a fault,
/// or the grace after its heal, is not judged. Returns (judged, out of
/// order).
fn fair_order(records: &[Record]) -> (u64, u64) {
    let mut calls: BTreeMap<(u32, u64, u64), FairCall> = BTreeMap::new();
    let mut faults: Vec<(u64, u64)> = Vec::new();
    let mut open_faults: Vec<u64> = Vec::new();
    for r in records {
        match r.kind {
            Kind::Call => {
                calls.insert(
                    (r.pid, r.holder, r.key),
                    FairCall {
                        started: r.token,
                        waited: r.detail,
                        ended: r.at,
                        entered: None,
                    },
                );
            }
            Kind::Enter => {
                if let Some(call) = calls.get_mut(&(r.pid, r.holder, r.key)) {
                    call.entered = Some(r.at);
                }
            }
            Kind::Fault => open_faults.push(r.at),
            Kind::Heal => {
                if let Some(began) = open_faults.pop() {
                    faults.push((began, r.at));
                }
            }
            _ => {}
        }
    }
    // A fault never healed lasts to the end.
    faults.extend(open_faults.into_iter().map(|began| (began, u64::MAX)));
    let grace = u64::try_from(PLACE_GRACE.as_nanos()).unwrap_or(u64::MAX);
    let near_a_fault = |from: u64, to: u64| {
        faults
            .iter()
            .any(|&(began, healed)| began <= to && healed.saturating_add(grace) >= from)
    };
    let mut by_key: BTreeMap<u64, Vec<&FairCall>> = BTreeMap::new();
    for (&(_, _, key), call) in &calls {
        by_key.entry(key).or_default().push(call);
    }
    let (mut judged, mut out_of_order) = (0, 0);
    for line in by_key.values() {
        for b in line {
            let Some(b_entered) = b.entered else {
                continue;
            };
            for a in line {
                let in_line_first = a.waited != 0 && a.waited < b.started && a.ended > b.started;
                if std::ptr::eq(*a, *b) || !in_line_first || near_a_fault(a.waited, b_entered) {
                    continue;
                }
                judged += 1;
                if a.ended > b_entered {
                    out_of_order += 1;
                }
            }
        }
    }
    (judged, out_of_order)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board() -> (tempfile::TempDir, Witness) {
        let dir = tempfile::tempdir().expect("dir");
        let witness = Witness::create(dir.path()).expect("board");
        (dir, witness)
    }

    #[test]
    fn a_second_body_inside_is_an_overlap_online_and_in_the_logs() {
        let (dir, w) = board();
        w.enter("k", 1, 5);
        w.enter("k", 2, 6);
        w.exit("k", 1, 5);
        w.exit("k", 2, 6);
        w.enter("k", 3, 7);
        w.exit("k", 3, 7);
        assert_eq!(w.seen("k").overlaps, 1);
        assert_eq!(w.seen("k").entries, 3);
        let analysis = analyze(dir.path(), &["k"]).expect("analyze");
        assert_eq!(analysis.overlaps.len(), 1, "{analysis:?}");
        assert_eq!(analysis.overlaps[0].key, "k");
        assert_eq!(analysis.token_regressions, 0);
        assert_eq!(analysis.unmatched, 0);
    }

    #[test]
    fn shares_overflow_only_when_the_kind_is_broken() {
        let (_dir, w) = board();
        w.enter_shared("rw", 1, 0, Share::READER);
        w.enter_shared("rw", 2, 0, Share::READER);
        assert_eq!(w.seen("rw").overlaps, 0, "readers share");
        w.enter_shared("rw", 3, 0, Share::WRITER);
        assert_eq!(w.seen("rw").overlaps, 1, "a writer beside readers");
        w.exit_shared("rw", 3, 0, Share::WRITER);
        w.exit_shared("rw", 1, 0, Share::READER);
        w.exit_shared("rw", 2, 0, Share::READER);
        w.enter_shared("rw", 4, 0, Share::WRITER);
        w.enter_shared("rw", 5, 0, Share::READER);
        assert_eq!(w.seen("rw").overlaps, 2, "a reader beside a writer");
        for holder in 1..=3 {
            w.enter_shared("pool", holder, 0, Share::permit(3));
        }
        assert_eq!(w.seen("pool").overlaps, 0, "three of three permits");
        w.enter_shared("pool", 4, 0, Share::permit(3));
        assert_eq!(w.seen("pool").overlaps, 1, "a fourth holder of three permits");
    }

    #[test]
    fn back_to_back_bodies_and_other_keys_do_not_overlap() {
        let (dir, w) = board();
        for holder in 0..100 {
            w.enter("a", holder, holder + 1);
            w.enter("b", holder, holder + 1);
            w.exit("a", holder, holder + 1);
            w.exit("b", holder, holder + 1);
        }
        let analysis = analyze(dir.path(), &["a", "b"]).expect("analyze");
        assert!(analysis.overlaps.is_empty(), "{analysis:?}");
        assert_eq!((analysis.entries, analysis.token_regressions), (200, 0));
        assert_eq!(w.seen("a").overlaps + w.seen("b").overlaps, 0);
    }

    #[test]
    fn a_token_that_goes_back_is_a_regression_and_the_fenced_register_refuses_it() {
        let (dir, w) = board();
        w.enter("k", 1, 9);
        assert!(w.write("k", 9, true));
        w.exit("k", 1, 9);
        w.enter("k", 2, 4);
        assert!(!w.write("k", 4, true), "stale token applied");
        assert!(w.write("k", 4, false), "the unfenced register applies anything");
        w.exit("k", 2, 4);
        let seen = w.seen("k");
        assert_eq!((seen.stale_rejected, seen.stale_accepted), (1, 1));
        assert_eq!(analyze(dir.path(), &[]).expect("analyze").token_regressions, 1);
    }

    #[test]
    fn a_body_that_never_left_is_reported() {
        let (dir, w) = board();
        w.enter("k", 1, 0);
        w.exit("k", 1, 0);
        w.enter("j", 2, 0);
        let analysis = analyze(dir.path(), &[]).expect("analyze");
        assert_eq!(analysis.unmatched, 1);
    }

    #[test]
    fn lost_slack_and_heal_to_entry_come_from_the_logs() {
        let (dir, w) = board();
        w.fault("server-sigstop");
        w.enter("k", 1, 0);
        w.lost("k", 1, 0, Instant::now() + Duration::from_millis(50));
        w.heal("server-sigstop");
        w.enter("k", 2, 0);
        w.exit("k", 2, 0);
        w.heal("server-sigstop");
        let analysis = analyze(dir.path(), &[]).expect("analyze");
        assert_eq!(analysis.lost_slack_ns.len(), 1);
        assert!(analysis.lost_slack_ns[0] > 40_000_000, "{analysis:?}");
        assert_eq!(analysis.faults_by_kind.get("server-sigstop"), Some(&1));
        assert_eq!(analysis.heal_to_entry_ns.len(), 1);
        assert_eq!(analysis.heals_without_entry, 1);
    }

    #[test]
    fn a_body_lost_while_its_process_was_stopped_ends_at_its_deadline() {
        let (dir, w) = board();
        let pid = std::process::id();
        w.enter("k", 1, 1);
        let deadline = Instant::now();
        // `instant_ns` reads two clocks, so it can differ by a few
        // microseconds from one call to the next: margins of a millisecond.
        let ms = 1_000_000;
        let stopped = Pause {
            pid,
            from: instant_ns(deadline) - ms,
            to: instant_ns(deadline) + ms,
        };
        w.enter("k", 2, 2);
        w.lost("k", 1, 1, deadline);
        w.exit("k", 2, 2);
        let overlaps = |pauses: &[Pause]| {
            analyze_with_pauses(dir.path(), &["k"], pauses)
                .expect("analyze")
                .overlaps
                .len()
        };
        assert_eq!(overlaps(&[]), 1, "noticed late and not stopped: an overlap");
        assert_eq!(overlaps(&[stopped]), 0, "stopped at its deadline: ended there");
        let other = Pause {
            pid: pid + 1,
            ..stopped
        };
        assert_eq!(overlaps(&[other]), 1, "another process's stop excuses nothing");
        let continued_before = Pause {
            from: instant_ns(deadline) - 2 * ms,
            to: instant_ns(deadline) - ms,
            ..stopped
        };
        assert_eq!(
            overlaps(&[continued_before]),
            1,
            "continued before its deadline: told late"
        );
    }

    /// A moment on the shared clock later than any before (records are
    /// ordered by it).
    fn tick() -> u64 {
        let at = now_ns();
        while now_ns() == at {}
        now_ns()
    }

    #[test]
    fn a_fair_call_that_went_ahead_of_one_in_line_is_out_of_order() {
        let (dir, w) = board();
        // A waits from before B starts; B enters first: out of order.
        let a_started = tick();
        let a_waited = tick();
        let b_started = tick();
        w.call("k", 2, b_started, None);
        w.enter("k", 2, 0);
        w.exit("k", 2, 0);
        w.call("k", 1, a_started, Some(a_waited));
        w.enter("k", 1, 0);
        w.exit("k", 1, 0);
        let analysis = analyze(dir.path(), &[]).expect("analyze");
        assert_eq!((analysis.fair_pairs, analysis.fair_out_of_order), (1, 1));

        // In order: C waits, D starts after, C enters before D.
        let (dir, w) = board();
        let c_started = tick();
        let c_waited = tick();
        let d_started = tick();
        w.call("k", 3, c_started, Some(c_waited));
        w.enter("k", 3, 0);
        w.exit("k", 3, 0);
        w.call("k", 4, d_started, Some(tick()));
        w.enter("k", 4, 0);
        w.exit("k", 4, 0);
        let analysis = analyze(dir.path(), &[]).expect("analyze");
        assert_eq!((analysis.fair_pairs, analysis.fair_out_of_order), (1, 0));
    }

    #[test]
    fn fair_order_is_not_judged_across_a_fault_or_between_keys() {
        let (dir, w) = board();
        let a_started = tick();
        let a_waited = tick();
        w.fault("server-sigstop");
        w.heal("server-sigstop");
        let b_started = tick();
        w.call("k", 2, b_started, None);
        w.enter("k", 2, 0);
        w.exit("k", 2, 0);
        w.call("k", 1, a_started, Some(a_waited));
        w.enter("k", 1, 0);
        w.exit("k", 1, 0);
        // Another key's line is another line.
        let c_started = tick();
        let c_waited = tick();
        let d_started = tick();
        w.call("j", 4, d_started, None);
        w.enter("j", 4, 0);
        w.exit("j", 4, 0);
        w.call("i", 3, c_started, Some(c_waited));
        let analysis = analyze(dir.path(), &[]).expect("analyze");
        assert_eq!((analysis.fair_pairs, analysis.fair_out_of_order), (0, 0));
    }

    #[test]
    fn a_body_inside_at_the_heal_is_not_counted_as_a_stall() {
        let (dir, w) = board();
        w.enter("k", 1, 0);
        w.heal("server-sigstop");
        std::thread::sleep(Duration::from_millis(30));
        w.exit("k", 1, 0);
        w.enter("k", 2, 0);
        w.exit("k", 2, 0);
        let analysis = analyze(dir.path(), &[]).expect("analyze");
        assert_eq!(analysis.heal_to_entry_ns.len(), 1);
        assert!(analysis.heal_to_entry_ns[0] < 20_000_000, "{analysis:?}");
    }
}
