//! Replicated Redis: `replica_acks` (`WAIT` after every acquire and
//! renewal) on a master with a replica, and a Sentinel client that follows
//! a failover. Real `redis-server` masters, replicas and sentinels.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LostReason};
use lock_tests::sentinel::MASTER_NAME;
use lock_tests::{RedisServer, Replicated};

fn exists(server: &RedisServer, key: &str) -> bool {
    server.query::<i64>(redis::cmd("EXISTS").arg(key)) == 1
}

/// With one replica acknowledging, locks are taken and renewed; with the
/// replica frozen, a held lease whose renewals go unacknowledged is declared
/// lost before its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acks_on_a_master_with_a_replica() {
    lock_tests::bounded("replica_acks_on_a_master_with_a_replica", async move {
    let group = Replicated::start_without_sentinels(1);
    let locks = LockClient::builder()
        .replica_acks(1)
        .replica_ack_timeout(Duration::from_millis(100))
        .connect(&group.master.url())
        .await
        .expect("connect");
    let guard = locks
        .lock("acked")
        .ttl(Duration::from_millis(600))
        .acquire()
        .await
        .expect("one replica acknowledges");
    // Several renewals, each acknowledged.
    tokio::time::timeout(Duration::from_millis(1500), guard.lost())
        .await
        .expect_err("renewed while the replica acknowledges");
    assert!(guard.is_held());
    let replica_has_it = group.replicas[0].query::<i64>(redis::cmd("EXISTS").arg("lock:{acked}"));
    assert_eq!(replica_has_it, 1, "the replica holds the lock");

    // (The fault suite's P3r times unacknowledged acquisitions.)
    group.replicas[0].pause();
    // The held lease's renewals now go unacknowledged: lost before D.
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("unacknowledged renewals end the lease");
    assert_eq!(reason, LostReason::Expired);
    group.replicas[0].resume();

    // A `WAIT` timeout the command timeout would cut short is refused.
    let err = LockClient::builder()
        .replica_acks(1)
        .replica_ack_timeout(Duration::from_secs(1))
        .connect(&group.master.url())
        .await
        .expect_err("ack timeout not shorter than the command timeout");
    assert!(
        matches!(&err, LockError::InvalidConfig { reason, .. } if reason.contains("shorter than the command timeout")),
        "{err}"
    );
    })
    .await
}

/// Sentinel clients, one with `replica_acks(1)`, over a master with two
/// replicas: the master is SIGKILLed while a lock is held. The sentinels
/// promote a replica, which has the lock (acknowledged), so the holder's
/// renewals keep it once the other replica follows the new master; new
/// locks go to the new master within the failover time and a second; a
/// waiter is let in when the holder releases after the switch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_follows_a_failover_and_acknowledged_locks_survive_it() {
    lock_tests::bounded(
        "sentinel_follows_a_failover_and_acknowledged_locks_survive_it",
        async move {
            let mut group = Replicated::start(2);
            let sentinel = |acks: u32| {
                LockClient::builder()
                    .replica_acks(acks)
                    .command_timeout(Duration::from_millis(500))
                    .sentinel(MASTER_NAME, group.sentinel_urls())
            };
            let locks = sentinel(1).await.expect("sentinel client");
            let plain = sentinel(0).await.expect("sentinel client without acks");
            let held = locks
                .lock("held")
                .ttl(Duration::from_secs(10))
                .acquire()
                .await
                .expect("lock before the failover");
            assert!(exists(&group.master, "lock:{held}"));

            let old_port = group.master.port();
            group.master.kill();
            let killed = Instant::now();
            let new_port = group.wait_for_failover(old_port, Duration::from_secs(30));
            let promoted = killed.elapsed();

            // New locks go to the new master, within the failover time and a second.
            let first_lock = plain
                .lock("after")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .expect("a lock on the new master");
            let first_acquire = killed.elapsed();
            let new_master = group.node(new_port).expect("the promoted replica");
            assert!(exists(new_master, "lock:{after}"), "not on the new master");
            assert!(
                first_acquire < promoted + Duration::from_secs(1) + Duration::from_secs(1),
                "first lock {first_acquire:?} after the kill; promoted after {promoted:?}"
            );
            first_lock.release().await.expect("release on the new master");
            // With acknowledgement, once the other replica follows the new master.
            locks
                .lock("acked-after")
                .wait(Duration::from_secs(20))
                .run(async {})
                .await
                .expect("an acknowledged lock on the new master");

            // The held lock survived on the promoted replica and is renewed there.
            assert!(
                exists(new_master, "lock:{held}"),
                "the acknowledged lock was lost"
            );
            tokio::time::timeout(Duration::from_secs(5), held.lost())
                .await
                .expect_err("renewals keep the lock on the new master");
            assert!(held.is_held());

            // A waiter on the held key gets in after the release.
            let waiter = locks.clone();
            let waiting = tokio::spawn(async move {
                waiter
                    .lock("held")
                    .wait(Duration::from_secs(10))
                    .run(async {})
                    .await
            });
            lock_tests::until_waiting(new_master, "held").await;
            held.release().await.expect("release after the failover");
            tokio::time::timeout(Duration::from_secs(15), waiting)
                .await
                .expect("the waiter got in")
                .expect("join")
                .expect("lock after the release");
            println!(
                "{{\"sentinel_failover\":{{\"promoted_ms\":{},\"first_acquire_after_kill_ms\":{}}}}}",
                promoted.as_millis(),
                first_acquire.as_millis()
            );
        },
    )
    .await
}

/// A Sentinel client that cannot reach any sentinel fails at construction
/// with an error naming them; `lazy()` defers it to the first call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_construction_errors() {
    lock_tests::bounded("sentinel_construction_errors", async move {
        let nowhere = format!("redis://127.0.0.1:{}/", lock_tests::free_port());
        let err = LockClient::builder()
            .command_timeout(Duration::from_millis(300))
            .startup_timeout(Duration::from_millis(600))
            .sentinel(MASTER_NAME, [nowhere.as_str()])
            .await
            .expect_err("no sentinel answers");
        assert!(matches!(err, LockError::Backend { .. }), "{err}");
        assert!(
            err.to_string().contains("not ready within 600ms"),
            "waited for: {err}"
        );
        let empty: [&str; 0] = [];
        let err = LockClient::sentinel(MASTER_NAME, empty)
            .await
            .expect_err("no URL");
        assert!(matches!(err, LockError::InvalidConfig { .. }), "{err}");
        let lazy = LockClient::builder()
            .lazy()
            .command_timeout(Duration::from_millis(300))
            .sentinel(MASTER_NAME, [nowhere.as_str()])
            .await
            .expect("lazy: nothing sent");
        let err = lazy.lock("k").run(async {}).await.expect_err("still no sentinel");
        assert!(matches!(err, LockError::Backend { .. }), "{err}");
    })
    .await
}
