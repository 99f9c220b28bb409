//! `#[distributed_lock]` used exactly as users write it, against a real
//! `redis-server`. The global client is installed before `main` because a
//! `#[distributed_lock] #[tokio::test]` function takes its lock before its
//! first line runs.
#![allow(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lock_runtime::{LockError, Tick, distributed_lock, fencing_token};
use lock_tests::{RedisServer, install_global_client};

// SAFETY: runs before `main`; it only spawns a thread and a child process
// and waits for them, touching no state that `main` sets up.
#[ctor::ctor(unsafe)]
fn install() {
    install_global_client();
}

fn redis() -> &'static RedisServer {
    install_global_client()
}

fn held(key: &str) -> bool {
    redis().query::<i64>(redis::cmd("EXISTS").arg(format!("lock:{{{key}}}"))) == 1
}

#[derive(Debug)]
enum ShopError {
    Lock(LockError),
    OutOfStock,
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        ShopError::Lock(e)
    }
}

#[distributed_lock(key = "stock:<product_id>", ttl = "30s", wait = "5s")]
async fn deduct_stock(product_id: u64, qty: u32) -> Result<u32, ShopError> {
    assert!(held(&format!("stock:{product_id}")));
    let left = check_stock(product_id).await?;
    left.checked_sub(qty).ok_or(ShopError::OutOfStock)
}

/// A different function on the same rendered key: called from inside
/// `deduct_stock`, it must re-enter instead of waiting for itself.
#[distributed_lock(key = "stock:<id>")]
async fn check_stock(id: u64) -> Result<u32, ShopError> {
    assert!(held(&format!("stock:{id}")));
    Ok(u32::try_from(id % 10).unwrap_or(0))
}

#[tokio::test]
async fn nested_functions_on_one_key_reenter_and_errors_flow_through_question_mark() {
    lock_tests::bounded(
        "nested_functions_on_one_key_reenter_and_errors_flow_through_question_mark",
        async move {
            assert_eq!(deduct_stock(7, 3).await.expect("in stock"), 4);
            assert!(!held("stock:7"));
            // `?` on the inner call's error, and the function's own error, both
            // leave the lock released.
            assert!(matches!(deduct_stock(3, 5).await, Err(ShopError::OutOfStock)));
            assert!(!held("stock:3"));
        },
    )
    .await
}

#[distributed_lock(key = "cart:<user>")]
async fn checkout(user: String, product_id: u64) -> Result<u32, ShopError> {
    assert!(held(&format!("cart:{user}")));
    // The key was rendered before the body, so the body may move `user`.
    drop(user);
    deduct_stock(product_id, 1).await
}

#[tokio::test]
async fn different_keys_nest() {
    lock_tests::bounded("different_keys_nest", async move {
        assert_eq!(checkout("ann".into(), 9).await.expect("nested"), 8);
        assert!(!held("cart:ann") && !held("stock:9"));
    })
    .await
}

#[distributed_lock(key = "report:<day>", wait = "50ms")]
async fn daily_report(day: u32) -> Result<u32, ShopError> {
    Ok(day)
}

#[tokio::test]
async fn a_held_lock_times_out_into_the_users_error_type() {
    lock_tests::bounded("a_held_lock_times_out_into_the_users_error_type", async move {
        let guard = lock_runtime::LockClient::connect(&redis().url())
            .await
            .expect("second client")
            .lock("report:1")
            .acquire()
            .await
            .expect("held by another client");
        match daily_report(1).await {
            Err(ShopError::Lock(LockError::Timeout { key, .. })) => assert_eq!(key, "report:1"),
            other => panic!("expected a timeout, got {other:?}"),
        }
        guard.release().await.expect("release");
        assert_eq!(daily_report(1).await.expect("free again"), 1);
    })
    .await
}

#[distributed_lock(key = "panicky:<n>")]
async fn panicky(n: u32) -> Result<u32, ShopError> {
    if n > 0 {
        panic!("refund failed for {n}");
    }
    Ok(n)
}

#[tokio::test]
async fn a_panic_inside_an_annotated_fn_releases_and_keeps_its_payload() {
    lock_tests::bounded(
        "a_panic_inside_an_annotated_fn_releases_and_keeps_its_payload",
        async move {
            let err = tokio::spawn(panicky(3)).await.expect_err("panics");
            assert_eq!(
                err.into_panic().downcast_ref::<String>().map(String::as_str),
                Some("refund failed for 3")
            );
            assert!(!held("panicky:3"));
        },
    )
    .await
}

struct Shop {
    id: u64,
    sold: AtomicUsize,
    last: u32,
}

impl Shop {
    #[distributed_lock(key = "shop:<self.id>")]
    async fn sell(&self, qty: usize) -> Result<usize, ShopError> {
        assert!(held(&format!("shop:{}", self.id)));
        Ok(self.sold.fetch_add(qty, Ordering::SeqCst) + qty)
    }

    #[distributed_lock(key = "shop:<self.id>:last")]
    async fn record(&mut self, qty: u32) -> Result<u32, ShopError> {
        assert!(held(&format!("shop:{}:last", self.id)));
        self.last = qty;
        Ok(self.last)
    }

    #[distributed_lock(key = "shop:<self.id>", fencing = true, renew = false, ttl = "10s")]
    async fn fenced(self: Arc<Self>) -> Result<u64, ShopError> {
        let pttl: i64 = redis().query(redis::cmd("PTTL").arg(format!("lock:{{shop:{}}}", self.id)));
        assert!(pttl > 0 && pttl <= 10_000, "ttl not applied: {pttl}");
        Ok(fencing_token().expect("fencing = true issues a token"))
    }
}

#[tokio::test]
async fn methods_lock_on_their_fields() {
    lock_tests::bounded("methods_lock_on_their_fields", async move {
        let mut shop = Shop {
            id: 5,
            sold: AtomicUsize::new(0),
            last: 0,
        };
        assert_eq!(shop.sell(2).await.expect("sell"), 2);
        assert_eq!(shop.record(4).await.expect("record"), 4);
        let shop = Arc::new(shop);
        let first = Arc::clone(&shop).fenced().await.expect("fenced");
        let second = shop.fenced().await.expect("fenced");
        assert!(
            second > first,
            "fencing tokens must increase: {first} then {second}"
        );
        assert!(!held("shop:5"));
    })
    .await
}

#[distributed_lock(key = "generic:<id>")]
async fn generic<K>(id: K, seen: impl Into<String>) -> Result<String, ShopError>
where
    K: std::fmt::Display + Send,
{
    assert!(held(&format!("generic:{id}")));
    Ok(seen.into())
}

struct Order {
    shop: String,
    id: u64,
}

#[distributed_lock(key = "order:<shop>:<id>")]
async fn pay(Order { shop, id }: Order) -> Result<u64, ShopError> {
    assert!(held(&format!("order:{shop}:{id}")));
    Ok(id)
}

trait Inventory {
    async fn restock(&self, product_id: u64) -> Result<u64, ShopError>;
}

struct Warehouse;

impl Inventory for Warehouse {
    #[distributed_lock(key = "restock:<product_id>")]
    async fn restock(&self, product_id: u64) -> Result<u64, ShopError> {
        assert!(held(&format!("restock:{product_id}")));
        Ok(product_id)
    }
}

#[tokio::test]
async fn generic_destructured_and_trait_impl_shapes_lock() {
    lock_tests::bounded("generic_destructured_and_trait_impl_shapes_lock", async move {
        assert_eq!(generic(11_u8, "x").await.expect("generic"), "x");
        assert_eq!(
            pay(Order {
                shop: "s".into(),
                id: 2
            })
            .await
            .expect("pay"),
            2
        );
        assert_eq!(Warehouse.restock(4).await.expect("restock"), 4);
    })
    .await
}

#[tracing::instrument]
#[distributed_lock(key = "traced:<n>")]
async fn traced_outside(n: u32) -> Result<u32, ShopError> {
    assert!(held(&format!("traced:{n}")));
    Ok(n)
}

#[distributed_lock(key = "traced:<n>")]
#[tracing::instrument]
async fn traced_inside(n: u32) -> Result<u32, ShopError> {
    assert!(held(&format!("traced:{n}")));
    Ok(n)
}

#[tokio::test]
async fn stacks_with_tracing_instrument_in_either_order() {
    lock_tests::bounded("stacks_with_tracing_instrument_in_either_order", async move {
        assert_eq!(traced_outside(1).await.expect("outside"), 1);
        assert_eq!(traced_inside(2).await.expect("inside"), 2);
    })
    .await
}

#[distributed_lock(key = "suite:stacked")]
#[tokio::test]
async fn stacks_with_tokio_test() -> Result<(), ShopError> {
    assert!(held("suite:stacked"));
    Ok(())
}

/// `on_busy = "skip"`: a job another holder runs returns "did not run"
/// (`Ok(())`, `Ok(None)`) without running its body; a free one runs.
/// Through a `Result` alias, as `anyhow::Result<()>` is one. (That a skip
/// ignores the client's default wait: `simulation.rs`.)
type JobResult<T> = Result<T, ShopError>;

static JOB_RUNS: AtomicUsize = AtomicUsize::new(0);

#[distributed_lock(key = "job:<name>", on_busy = "skip")]
async fn scheduled_job(name: &str) -> JobResult<()> {
    assert!(held(&format!("job:{name}")));
    JOB_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "job:<name>", on_busy = "skip")]
async fn scheduled_report(name: &str) -> Result<Option<usize>, LockError> {
    Ok(Some(name.len()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipping_job_returns_without_running_while_another_holds_its_lock() {
    lock_tests::bounded(
        "a_skipping_job_returns_without_running_while_another_holds_its_lock",
        async move {
            scheduled_job("free").await.expect("a free job runs");
            assert_eq!(JOB_RUNS.load(Ordering::SeqCst), 1);
            assert_eq!(scheduled_report("free").await.expect("runs"), Some(4));

            let rival = lock_runtime::LockClient::connect(&redis().url())
                .await
                .expect("connect");
            let guard = rival
                .lock("job:busy")
                .acquire()
                .await
                .expect("the rival holds it");
            scheduled_job("busy").await.expect("a skip is not an error");
            assert_eq!(JOB_RUNS.load(Ordering::SeqCst), 1, "the skipped body never ran");
            assert_eq!(
                scheduled_report("busy").await.expect("a skip is not an error"),
                None
            );
            guard.release().await.expect("release");
            scheduled_job("busy").await.expect("free again");
            assert_eq!(JOB_RUNS.load(Ordering::SeqCst), 2);
        },
    )
    .await
}

#[distributed_lock(key = "ticked:<tick>", on_busy = "skip")]
async fn ticked_job(tick: Tick, runs: &AtomicUsize) -> Result<(), LockError> {
    assert!(held(&format!("ticked:{tick}")));
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Two replicas firing the same tick 300 ms apart render the same key: the
/// late one skips while the early one's run holds it; the next tick is a
/// lock of its own. (A run that ends before the late replica fires leaves
/// it the lock unless the job holds it at least: the test after this.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_held_by_one_replica_is_skipped_by_another_and_the_next_tick_runs() {
    lock_tests::bounded(
        "a_tick_held_by_one_replica_is_skipped_by_another_and_the_next_tick_runs",
        async move {
            let period = std::time::Duration::from_secs(60);
            let scheduled = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_000_000 / 60 * 60);
            let early = Tick::nearest(scheduled - std::time::Duration::from_millis(300), period);
            let late = Tick::nearest(scheduled + std::time::Duration::from_millis(300), period);
            let runs = AtomicUsize::new(0);
            // The early replica's run, through a client of its own.
            let early_replica = lock_runtime::LockClient::connect(&redis().url())
                .await
                .expect("connect");
            let running = early_replica
                .lock(format!("ticked:{early}"))
                .acquire()
                .await
                .expect("the early replica runs the tick");
            ticked_job(late, &runs).await.expect("a skip is not an error");
            assert_eq!(
                runs.load(Ordering::SeqCst),
                0,
                "the late replica skipped the tick"
            );
            running.release().await.expect("release");
            ticked_job(Tick::nearest(scheduled + period, period), &runs)
                .await
                .expect("the next tick");
            assert_eq!(runs.load(Ordering::SeqCst), 1, "the next tick ran");
        },
    )
    .await
}

#[distributed_lock(key = "held-tick:<tick>", on_busy = "skip", hold_at_least = "1m")]
async fn held_tick_job(tick: Tick, runs: &AtomicUsize) -> Result<(), LockError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// `hold_at_least` in the attribute: the early replica's run is over in
/// microseconds, and the late replica, firing after it, still finds the
/// tick held and skips; the server keeps the key for what is left of the
/// minute, not for the 30 s lease it was granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_tick_is_skipped_by_a_replica_firing_after_the_run_ended() {
    lock_tests::bounded(
        "a_held_tick_is_skipped_by_a_replica_firing_after_the_run_ended",
        async move {
            let period = std::time::Duration::from_secs(3600);
            let scheduled =
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_000_000 / 3600 * 3600);
            let early = Tick::nearest(scheduled - std::time::Duration::from_millis(300), period);
            let late = Tick::nearest(scheduled + std::time::Duration::from_millis(300), period);
            let runs = AtomicUsize::new(0);
            held_tick_job(early, &runs)
                .await
                .expect("the early replica runs it");
            assert_eq!(runs.load(Ordering::SeqCst), 1);
            let left: i64 = redis().query(redis::cmd("PTTL").arg(format!("lock:{{held-tick:{early}}}")));
            assert!(
                (30_001..=60_700).contains(&left),
                "kept {left} ms: the minute's hold, not the 30 s lease"
            );
            // The late replica, after the run ended: another acquisition,
            // so another holder, though of the same client here.
            held_tick_job(late, &runs).await.expect("a skip is not an error");
            assert_eq!(
                runs.load(Ordering::SeqCst),
                1,
                "the late replica skipped the tick"
            );
        },
    )
    .await
}
