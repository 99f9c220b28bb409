//! The `distributed_lock_*` metrics (README, "Observability"), read through
//! a recorder installed in this test process, while locks are taken on a
//! real `redis-server`.
//!
//! The held gauge and the renewal counter have no `lock` label, so the
//! tests take turns (`TURN`) and compare readings before and after.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LostReason, distributed_lock};
use lock_tests::{RedisServer, eventually, install_global_client};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

// SAFETY: runs before `main`; it only spawns a thread and a child process
// and waits for them, touching no state that `main` sets up.
#[ctor::ctor(unsafe)]
fn install() {
    recorded();
    install_global_client();
}

/// One metric series: its name and its labels, sorted.
type Series = (String, Vec<(String, String)>);

/// Everything recorded since the process started. The debugging recorder
/// hands out what changed since its last snapshot, so readings are summed
/// here (a gauge's increments and decrements add up the same way).
#[derive(Default)]
struct Totals {
    counters: HashMap<Series, u64>,
    gauges: HashMap<Series, f64>,
    histograms: HashMap<Series, Vec<f64>>,
}

fn recorded() -> &'static (Snapshotter, Mutex<Totals>) {
    static RECORDED: OnceLock<(Snapshotter, Mutex<Totals>)> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("no other recorder in this test process");
        (snapshotter, Mutex::new(Totals::default()))
    })
}

/// Reads the recorder and runs `read` over the totals so far.
fn totals<T>(read: impl FnOnce(&Totals) -> T) -> T {
    let (snapshotter, totals) = recorded();
    let mut totals = totals.lock().expect("not poisoned");
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let series = (key.name().to_owned(), labels);
        match value {
            DebugValue::Counter(n) => *totals.counters.entry(series).or_default() += n,
            DebugValue::Gauge(g) => *totals.gauges.entry(series).or_default() += g.into_inner(),
            DebugValue::Histogram(values) => totals
                .histograms
                .entry(series)
                .or_default()
                .extend(values.into_iter().map(|v| v.into_inner())),
        }
    }
    read(&totals)
}

fn series(name: &str, labels: &[(&str, &str)]) -> Series {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.sort();
    (name.to_owned(), labels)
}

fn acquires(lock: &str, outcome: &str) -> u64 {
    let s = series(
        "distributed_lock_acquire_total",
        &[("lock", lock), ("outcome", outcome)],
    );
    totals(|t| t.counters.get(&s).copied().unwrap_or(0))
}

fn skipped(lock: &str) -> u64 {
    let s = series("distributed_lock_skipped_total", &[("lock", lock)]);
    totals(|t| t.counters.get(&s).copied().unwrap_or(0))
}

fn samples(name: &str, lock: &str) -> Vec<f64> {
    let s = series(name, &[("lock", lock)]);
    totals(|t| t.histograms.get(&s).cloned().unwrap_or_default())
}

fn renewals(outcome: &str) -> u64 {
    let s = series("distributed_lock_renewals_total", &[("outcome", outcome)]);
    totals(|t| t.counters.get(&s).copied().unwrap_or(0))
}

/// The renewal lags recorded so far, in seconds (one per renewed batch).
fn renewal_lags() -> Vec<f64> {
    let s = series("distributed_lock_renewal_lag_seconds", &[]);
    totals(|t| t.histograms.get(&s).cloned().unwrap_or_default())
}

fn lost(lock: &str, reason: &str) -> u64 {
    let s = series(
        "distributed_lock_lost_total",
        &[("lock", lock), ("reason", reason)],
    );
    totals(|t| t.counters.get(&s).copied().unwrap_or(0))
}

fn held() -> f64 {
    let s = series("distributed_lock_held", &[]);
    totals(|t| t.gauges.get(&s).copied().unwrap_or(0.0))
}

/// One test at a time: the gauge and the renewal counter are process-wide.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn redis() -> &'static RedisServer {
    install_global_client()
}

async fn client() -> LockClient {
    LockClient::connect(&redis().url()).await.expect("connect")
}

#[distributed_lock(key = "metered:<id>", wait = "0s")]
async fn metered(id: u64, nested: bool) -> Result<u64, LockError> {
    if nested {
        // The same rendered key: a re-entry, counted as such.
        Box::pin(metered(id, false)).await?;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(id)
}

#[distributed_lock(key = "skipping:<id>", on_busy = "skip")]
async fn skipping(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

/// A skip counts in `distributed_lock_skipped_total`, not as a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_call_counts_as_skipped() {
    lock_tests::bounded("a_skipped_call_counts_as_skipped", async move {
        let _turn = TURN.lock().await;
        let template = "skipping:<id>";
        let before = (
            skipped(template),
            acquires(template, "timeout"),
            skipped("nightly"),
        );
        let rival = client().await;
        let guard = rival.lock("skipping:1").acquire().await.expect("rival");
        skipping(1).await.expect("a skip is no error");
        let other = rival.clone();
        let programmatic =
            tokio::spawn(async move { other.lock("skipping:1").name("nightly").try_run(async {}).await })
                .await
                .expect("task")
                .expect("a skip is no error");
        assert!(programmatic.is_none());
        guard.release().await.expect("release");
        assert_eq!(skipped(template) - before.0, 1);
        assert_eq!(
            acquires(template, "timeout") - before.1,
            0,
            "a skip is no timeout"
        );
        assert_eq!(skipped("nightly") - before.2, 1);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_counts_under_its_key_template_not_the_rendered_key() {
    lock_tests::bounded(
        "the_attribute_counts_under_its_key_template_not_the_rendered_key",
        async move {
            let _turn = TURN.lock().await;
            let template = "metered:<id>";
            let before = (
                acquires(template, "acquired"),
                acquires(template, "reentered"),
                acquires(template, "timeout"),
                samples("distributed_lock_wait_seconds", template).len(),
                samples("distributed_lock_hold_seconds", template).len(),
            );

            for id in 1..=3 {
                metered(id, id == 3).await.expect("free");
            }
            // Held elsewhere: `wait = "0s"` gives up at once.
            let rival = client().await;
            let guard = rival.lock("metered:9").acquire().await.expect("rival");
            assert!(matches!(metered(9, false).await, Err(LockError::Timeout { .. })));
            guard.release().await.expect("release");

            assert_eq!(acquires(template, "acquired") - before.0, 3);
            assert_eq!(acquires(template, "reentered") - before.1, 1);
            assert_eq!(acquires(template, "timeout") - before.2, 1);
            let waits = samples("distributed_lock_wait_seconds", template);
            assert_eq!(waits.len() - before.3, 3, "one wait per acquisition");
            let holds = samples("distributed_lock_hold_seconds", template);
            assert_eq!(holds.len() - before.4, 3, "one hold per acquisition");
            assert!(
                holds[before.4..].iter().all(|&s| s >= 0.020),
                "each body slept 20 ms inside the lock (the nested one twice): {holds:?}"
            );
            // No series was made for a rendered key.
            assert_eq!(acquires("metered:1", "acquired"), 0);
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programmatic_calls_count_under_their_name_or_programmatic() {
    lock_tests::bounded(
        "programmatic_calls_count_under_their_name_or_programmatic",
        async move {
            let _turn = TURN.lock().await;
            let locks = client().await;
            let (named, unnamed) = (
                acquires("orders", "acquired"),
                acquires("programmatic", "acquired"),
            );
            locks
                .lock("orders:1")
                .name("orders")
                .run(async {})
                .await
                .expect("free");
            locks.lock("orders:2").run(async {}).await.expect("free");
            let set = locks
                .lock_all(["orders:3", "orders:4"])
                .name("orders")
                .acquire()
                .await
                .expect("free");
            set.release().await.expect("release");
            assert_eq!(
                acquires("orders", "acquired") - named,
                2,
                "one per call, not per key"
            );
            assert_eq!(acquires("programmatic", "acquired") - unnamed, 1);
            // The same set taken again inside its own body is a re-entry.
            let (acquired, reentered) = (acquires("orders", "acquired"), acquires("orders", "reentered"));
            locks
                .lock_all(["orders:3", "orders:4"])
                .name("orders")
                .run(async {
                    locks
                        .lock_all(["orders:4", "orders:3"])
                        .name("orders")
                        .run(async {})
                        .await
                })
                .await
                .expect("free")
                .expect("re-entered");
            assert_eq!(acquires("orders", "acquired") - acquired, 1, "the outer set");
            assert_eq!(acquires("orders", "reentered") - reentered, 1, "the inner set");

            // An error before any I/O is an error, not a timeout.
            let errors = acquires("orders", "error");
            let bad = locks.lock("bad{key}").name("orders").acquire().await;
            assert!(matches!(bad, Err(LockError::InvalidKey { .. })));
            assert_eq!(acquires("orders", "error") - errors, 1);
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_held_gauge_follows_acquisitions_and_releases() {
    lock_tests::bounded("the_held_gauge_follows_acquisitions_and_releases", async move {
        let _turn = TURN.lock().await;
        let locks = client().await;
        let base = held();
        let mut guards = Vec::new();
        for i in 0..3 {
            guards.push(locks.lock(format!("gauge:{i}")).acquire().await.expect("free"));
        }
        assert_eq!(held() - base, 3.0);
        // Nested inside a held lock, a call re-enters: no new lock is held.
        let nested = locks
            .lock("gauge:nested")
            .run(async { locks.lock("gauge:nested").run(async { held() }).await })
            .await
            .expect("free")
            .expect("re-entered");
        assert_eq!(nested - base, 4.0);
        let last = guards.pop().expect("three guards");
        last.release().await.expect("release");
        assert_eq!(held() - base, 2.0);
        // Dropped without a release: the drop guard releases it.
        drop(guards.pop());
        let settled = eventually(Duration::from_secs(2), || held() - base == 1.0).await;
        assert!(settled.is_some(), "a dropped guard still counts as held");
        for guard in guards {
            guard.release().await.expect("release");
        }
        assert_eq!(held() - base, 0.0);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_and_losses_are_counted_with_their_reason() {
    lock_tests::bounded("renewals_and_losses_are_counted_with_their_reason", async move {
        let _turn = TURN.lock().await;
        let locks = client().await;
        let renewed = renewals("renewed");
        let lags = renewal_lags().len();

        // Renewed a few times while the body runs (every ttl/3). A second of
        // lease leaves a starved test process ample time to renew.
        let ttl = Duration::from_secs(1);
        locks
            .lock("renewed")
            .name("renewed")
            .ttl(ttl)
            .run(tokio::time::sleep(ttl + ttl / 2))
            .await
            .expect("kept by renewal");
        assert!(renewals("renewed") > renewed, "no renewal counted");
        // Each renewed batch records how late it was confirmed: within the
        // lease, which was kept.
        let new_lags = renewal_lags().split_off(lags);
        assert!(!new_lags.is_empty(), "no renewal lag recorded");
        assert!(
            new_lags
                .iter()
                .all(|&lag| (0.0..ttl.as_secs_f64()).contains(&lag)),
            "lags outside the lease: {new_lags:?}"
        );

        // Deleted behind the holder's back: the next renewal finds it gone.
        let (gone, taken) = (renewals("lost"), lost("deleted", "taken_over"));
        let body = async {
            redis().query::<i64>(redis::cmd("DEL").arg("lock:{deleted}"));
            std::future::pending::<()>().await;
        };
        let run = locks.lock("deleted").name("deleted").ttl(ttl).run(body).await;
        assert!(matches!(
            run,
            Err(LockError::Lost {
                reason: LostReason::TakenOver,
                ..
            })
        ));
        assert_eq!(renewals("lost") - gone, 1);
        assert_eq!(lost("deleted", "taken_over") - taken, 1);

        // A fixed lease that runs out while its body runs.
        let ended = lost("fixed", "lease_ended");
        let run = locks
            .lock("fixed")
            .name("fixed")
            .ttl(Duration::from_millis(300))
            .wait(Duration::from_secs(5))
            .renew(false)
            .run(std::future::pending::<()>())
            .await;
        assert!(matches!(run, Err(LockError::Lost { .. })));
        assert_eq!(lost("fixed", "lease_ended") - ended, 1);

        // Every lease above ended: none is still counted as held.
        let settled = eventually(Duration::from_secs(2), || held() == 0.0).await;
        assert!(settled.is_some(), "held gauge stuck at {}", held());
    })
    .await
}
