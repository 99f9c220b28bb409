//! Redis Cluster (scenarios C1–C4), on a cluster of 3 masters and 3
//! replicas that each test starts on free ports.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use lock_tests::{Cluster, increment_under_lock, spawn_waiter};

async fn cluster_client(urls: &[String]) -> LockClient {
    LockClient::builder()
        .command_timeout(Duration::from_millis(500))
        .cluster(urls)
        .await
        .expect("cluster client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_never_lose_an_update_on_the_cluster() {
    lock_tests::bounded("sixteen_tasks_never_lose_an_update_on_the_cluster", async move {
        let cluster = Cluster::start(3, 1);
        let locks = cluster_client(&cluster.urls()).await;
        let data = redis::cluster::ClusterClient::new(cluster.urls())
            .expect("urls")
            .get_async_connection()
            .await
            .expect("data connection");
        assert_eq!(increment_under_lock(&locks, data, 16, 50).await, 800);
        c1_every_accepted_key_works_in_one_slot(&cluster, &locks).await;
    })
    .await
}

/// C1 live (the offline half is `key.rs`'s property test over 60,000 keys):
/// random keys over an alphabet chosen to break hash tags either take and
/// release a fenced lock on the cluster, with the lock, its fence counter
/// and its channel in one slot by `CLUSTER KEYSLOT`, or are refused before
/// any I/O.
async fn c1_every_accepted_key_works_in_one_slot(cluster: &Cluster, locks: &LockClient) {
    use rand::{Rng, SeedableRng};
    const ALPHABET: &[char] = &[
        'a', 'Z', '0', ':', ' ', '{', '}', '\n', '\0', 'é', '漢', '🔒', '<', '.',
    ];
    let seed = 0xC1;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut probe = cluster.nodes[0].sync_connection().expect("probe");
    let (mut accepted, mut refused, mut mismatches) = (0u32, 0u32, 0u32);
    for _ in 0..300 {
        let len = rng.random_range(0..10);
        let name: String = (0..len)
            .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())])
            .collect();
        let sent_before = Instant::now();
        match locks.lock(name.as_str()).fencing(true).acquire().await {
            Ok(guard) => {
                guard.release().await.expect("release");
                accepted += 1;
                let slots: Vec<i64> = ["", ":fence", ":released"]
                    .iter()
                    .map(|suffix| {
                        redis::cmd("CLUSTER")
                            .arg("KEYSLOT")
                            .arg(format!("lock:{{{name}}}{suffix}"))
                            .query(&mut probe)
                            .expect("keyslot")
                    })
                    .collect();
                if slots.iter().any(|s| *s != slots[0]) {
                    mismatches += 1;
                }
            }
            Err(LockError::InvalidKey { .. }) => {
                refused += 1;
                assert!(
                    sent_before.elapsed() < Duration::from_millis(5),
                    "refused after I/O?"
                );
            }
            Err(other) => panic!("{name:?}: {other}"),
        }
    }
    assert_eq!(mismatches, 0);
    assert!(
        accepted > 50 && refused > 50,
        "accepted {accepted}, refused {refused}"
    );
    lock_tests::report::write(
        "C1",
        serde_json::json!({
            "scenario": "C1 co-location (live sample on a 3+3 cluster)",
            "verdict": "PASS",
            "seed": seed,
            "acquisitions": accepted,
            "refused_before_io": refused,
            "slot_mismatches": mismatches,
            "offline": "key.rs: 20,000 names x 3 prefixes, 0 mismatches",
            "key_figure": format!("{accepted} fenced locks across the cluster, 0 CROSSSLOT, {refused} refused"),
        }),
    );
}

/// C4: a waiter whose client was seeded through another node is woken by
/// the shard's SPUBLISH, not by its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_seeded_elsewhere_are_woken_by_sharded_notifications() {
    lock_tests::bounded(
        "waiters_seeded_elsewhere_are_woken_by_sharded_notifications",
        async move {
            let cluster = Cluster::start(3, 1);
            let urls = cluster.urls();
            let holder = cluster_client(&urls[..1]).await;
            let waiter = cluster_client(&urls[4..5]).await;
            let mut latencies_ms = Vec::new();
            for trial in 0..10 {
                let key = format!("c4:{trial}");
                let guard = holder.lock(key.as_str()).acquire().await.expect("acquire");
                let waiting = spawn_waiter(&waiter, &key);
                // Subscribed once the shard counts a subscriber on the channel.
                let master = cluster.master_of(&format!("lock:{{{key}}}"));
                let channel = format!("lock:{{{key}}}:released");
                let subscribed = lock_tests::eventually(Duration::from_secs(5), || {
                    let reply: (String, i64) =
                        cluster.nodes[master].query(redis::cmd("PUBSUB").arg("SHARDNUMSUB").arg(&channel));
                    reply.1 >= 1
                })
                .await;
                assert!(subscribed.is_some(), "the waiter never subscribed");
                let released = Instant::now();
                guard.release().await.expect("release");
                let acquired = waiting.await.expect("join");
                latencies_ms.push(acquired.duration_since(released).as_secs_f64() * 1e3);
            }
            latencies_ms.sort_by(f64::total_cmp);
            let p50 = latencies_ms[latencies_ms.len() / 2];
            println!(
                "{{\"cluster_handoff_seeded_elsewhere_p50_ms\":{p50:.2},\"max_ms\":{:.2}}}",
                latencies_ms[9]
            );
            assert!(
                p50 < 50.0,
                "handoff p50 {p50:.1}ms: woken by the poll, not a notification"
            );
        },
    )
    .await
}

/// C2: moving the lock's slot to another master while the lock is held and
/// renewed: no false loss, the release works, and a waiter gets it after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_reshard_of_the_slot_keeps_the_lock() {
    lock_tests::bounded("a_live_reshard_of_the_slot_keeps_the_lock", async move {
        let cluster = Cluster::start(3, 1);
        let locks = cluster_client(&cluster.urls()).await;
        let redis_key = "lock:{moving}";
        let ttl = Duration::from_millis(900);
        let guard = locks.lock("moving").ttl(ttl).acquire().await.expect("acquire");

        let source = cluster.master_of(redis_key);
        let target = (0..3).find(|&m| m != source).expect("another master");
        let slot: i64 = cluster.nodes[source].query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(redis_key));
        let (source_id, target_id) = (cluster.node_id(source), cluster.node_id(target));
        cluster.nodes[target].query::<()>(
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("IMPORTING")
                .arg(&source_id),
        );
        cluster.nodes[source].query::<()>(
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("MIGRATING")
                .arg(&target_id),
        );
        // Renewals meet the slot half-moved.
        tokio::time::sleep(ttl / 2).await;
        let keys: Vec<String> =
            cluster.nodes[source].query(redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(100));
        assert!(
            keys.iter().any(|k| k == redis_key),
            "the lock lives on the source: {keys:?}"
        );
        cluster.nodes[source].query::<()>(
            redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(cluster.nodes[target].port())
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys),
        );
        tokio::time::sleep(ttl / 2).await;
        for master in 0..3 {
            cluster.nodes[master].query::<()>(
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg("NODE")
                    .arg(&target_id),
            );
        }
        // Two more renewal intervals on the new owner.
        tokio::time::sleep(ttl).await;
        assert!(guard.is_held(), "lost across the reshard");
        assert_eq!(cluster.master_of(redis_key), target);
        let pttl: i64 = cluster.nodes[target].query(redis::cmd("PTTL").arg(redis_key));
        assert!(pttl > 0, "the lock is on the new owner with a lease: {pttl}");
        guard.release().await.expect("release after the move");
        locks
            .lock("moving")
            .acquire()
            .await
            .expect("free after the release")
            .release()
            .await
            .expect("release");
    })
    .await
}

/// C3: killing the master that owns the lock's slot. A replica takes over
/// within the node timeout plus a few seconds; the holder either still holds
/// a lock the new master really has, or was told it lost it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_slots_master_recovers_and_never_lies() {
    lock_tests::bounded("killing_the_slots_master_recovers_and_never_lies", async move {
        let mut cluster = Cluster::start(3, 1);
        let locks = cluster_client(&cluster.urls()).await;
        let ttl = Duration::from_secs(4);
        let guard = locks.lock("failover").ttl(ttl).acquire().await.expect("acquire");
        let master = cluster.master_of("lock:{failover}");
        // Let the write reach the replica, as it usually has in practice.
        tokio::time::sleep(Duration::from_millis(200)).await;
        cluster.nodes[master].kill();
        let killed = Instant::now();

        // Recovery: the slot answers again. A separate holder (a spawned task)
        // asks for the same lock: granted or held, either is an answer.
        let mut recovered = None;
        while killed.elapsed() < Duration::from_secs(10) {
            let probe = locks.clone();
            let answer = tokio::spawn(async move { probe.lock("failover").acquire().await })
                .await
                .expect("probe task");
            match answer {
                Ok(g) => {
                    recovered = Some(killed.elapsed());
                    g.release().await.expect("release probe");
                    break;
                }
                Err(LockError::Timeout { .. }) => {
                    recovered = Some(killed.elapsed());
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        let recovered = recovered.expect("the cluster recovered");
        println!("{{\"cluster_failover_recovery_ms\":{}}}", recovered.as_millis());
        assert!(
            recovered <= Duration::from_secs(1) + Duration::from_secs(3),
            "recovered after {recovered:?}"
        );

        // Give the watchdog a renewal interval on the new master.
        tokio::time::sleep(ttl / 3 + Duration::from_millis(200)).await;
        let new_master = cluster.master_of("lock:{failover}");
        assert_ne!(new_master, master);
        let value: Option<String> = cluster.nodes[new_master].query(redis::cmd("GET").arg("lock:{failover}"));
        if guard.is_held() {
            assert!(
                value.is_some(),
                "the holder believes it holds a lock the new master does not have"
            );
            guard.release().await.expect("release on the new master");
        } else {
            assert!(matches!(
                guard.release().await,
                Err(LockError::NotHeld { .. }) | Ok(())
            ));
        }
    })
    .await
}

#[tokio::test]
async fn cluster_configuration_errors_are_refused() {
    lock_tests::bounded("cluster_configuration_errors_are_refused", async move {
        let none: [&str; 0] = [];
        let empty = LockClient::cluster(none).await;
        assert!(matches!(empty, Err(LockError::InvalidConfig { .. })), "{empty:?}");
        let bad = LockClient::cluster(["redis//u:hunter2@x"]).await;
        match bad {
            Err(e @ LockError::InvalidConfig { .. }) => assert!(!format!("{e} {e:?}").contains("hunter2")),
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    })
    .await
}

/// `replica_acks` on a cluster waits on the master of each key's slot: with
/// one replica per master, `replica_acks(1)` takes keys on every master, and
/// `replica_acks(2)` reports 1 of 2 and leaves nothing at the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acks_wait_on_the_master_of_each_key() {
    lock_tests::bounded("replica_acks_wait_on_the_master_of_each_key", async move {
        let cluster = Cluster::start(3, 1);
        let one = LockClient::builder()
            .replica_acks(1)
            .cluster(cluster.urls())
            .await
            .expect("cluster client");
        let mut masters = std::collections::BTreeSet::new();
        for i in 0..12 {
            let key = format!("acked:{i}");
            masters.insert(cluster.master_of(&format!("lock:{{{key}}}")));
            // Within a wait: a replica still catching up right after the
            // cluster formed acknowledges late, and an unacknowledged
            // acquisition is given back and retried within `wait`.
            one.lock(key.as_str())
                .wait(Duration::from_secs(5))
                .run(async {})
                .await
                .expect("one replica acknowledges");
        }
        assert_eq!(masters.len(), 3, "the keys cover every master");
        let two = LockClient::builder()
            .replica_acks(2)
            .cluster(cluster.urls())
            .await
            .expect("cluster client");
        let err = two
            .lock("acked:x")
            .run(async {})
            .await
            .expect_err("one replica only");
        assert!(
            matches!(
                &err,
                LockError::NotReplicated {
                    acked: 1,
                    wanted: 2,
                    ..
                }
            ),
            "{err}"
        );
        let master = cluster.master_of("lock:{acked:x}");
        let left: i64 = cluster.nodes[master].query(redis::cmd("EXISTS").arg("lock:{acked:x}"));
        assert_eq!(left, 0, "an unacknowledged lock was left");
    })
    .await
}
