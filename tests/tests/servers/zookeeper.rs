//! The ZooKeeper backend against real servers the harness starts: the
//! queue and its one watch per waiter (no herd), sessions as leases (a
//! killed holder let go when its session expires, a stopped one told
//! `Lost` and never acting again), fencing by creation zxid, an ensemble
//! losing a member and its leader, and bad input.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError, LostReason};
use lock_tests::lab::{Board, worker_command};
use lock_tests::load::LockingLoad;
use lock_tests::zookeeper::{self, SESSION_TIMEOUT, ZooKeeper};

/// Waits until `check` holds, polling every 5 ms for at most `within`.
async fn until(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    check()
}

/// The children of a lock's queue, read with a separate session.
async fn queue_len(zk: &ZooKeeper, key: &str) -> usize {
    let client = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .expect("inspecting session");
    let path = format!("/distributed-locks/lock:{{{key}}}");
    client.list_children(&path).await.map_or(0, |c| c.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiter_not_the_herd() {
    lock_tests::bounded("a_release_wakes_one_waiter_not_the_herd", async move {
        let zk = ZooKeeper::start();
        // A session far longer than the test: a waiter also looks again
        // once per session timeout (the longest the child ahead of it can
        // outlive its holder), and with the suite's 1 s session those
        // looks, all 50 at once, landed among the handoffs of a slow run
        // (a watch count read mid-look: 24, not 40). Nothing here is killed.
        let locks = zookeeper::long_session_client(&zk).await;
        let first = locks.lock("herd").acquire().await.expect("first holder");
        // 50 waiters, each in its own task and holding until told to go.
        let entered = Arc::new(AtomicUsize::new(0));
        let go = Arc::new(tokio::sync::Semaphore::new(0));
        let waiters: Vec<_> = (0..50)
            .map(|_| {
                let (locks, entered, go) = (locks.clone(), Arc::clone(&entered), Arc::clone(&go));
                tokio::spawn(async move {
                    locks
                        .lock("herd")
                        .wait(Duration::from_secs(120))
                        .run(async {
                            entered.fetch_add(1, Ordering::SeqCst);
                            go.acquire().await.expect("open").forget();
                        })
                        .await
                })
            })
            .collect();
        // Every waiter in line, each watching the one before it.
        let watching = until(Duration::from_secs(30), || {
            zk.monitor(0, "zk_watch_count") == Some(50)
        })
        .await;
        assert!(
            watching,
            "watches set: {:?} (50 expected)",
            zk.monitor(0, "zk_watch_count")
        );
        assert_eq!(queue_len(&zk, "herd").await, 51);

        let mut per_handoff = Vec::new();
        let before = zk.monitor(0, "zk_packets_received").expect("mntr");
        first.release().await.expect("release");
        assert!(until(Duration::from_secs(10), || entered.load(Ordering::SeqCst) == 1).await);
        let after = zk.monitor(0, "zk_packets_received").expect("mntr");
        per_handoff.push(after - before);
        for n in 2..=10 {
            let before = zk.monitor(0, "zk_packets_received").expect("mntr");
            go.add_permits(1);
            assert!(until(Duration::from_secs(10), || entered.load(Ordering::SeqCst) == n).await);
            let after = zk.monitor(0, "zk_packets_received").expect("mntr");
            per_handoff.push(after - before);
        }
        // The others are still in line, untouched.
        assert_eq!(zk.monitor(0, "zk_watch_count"), Some(40));
        // A handoff costs the releaser's delete and the next holder's
        // listing (plus a session ping now and then, more of them if this
        // machine is slow): a herd would be a listing and a new watch from
        // each of the 40 or more waiters left.
        let worst = per_handoff.iter().max().copied().unwrap_or(0);
        assert!(
            worst <= 20,
            "packets the server received per handoff: {per_handoff:?} (a herd would be ≥ 80)"
        );
        eprintln!("packets per handoff: {per_handoff:?}");
        go.add_permits(100);
        for w in waiters {
            w.await.expect("join").expect("every waiter got the lock");
        }
        assert_eq!(entered.load(Ordering::SeqCst), 50);
    })
    .await
}

/// An uncontended acquire + release is three operations (create, list,
/// delete), as the README says: counted by the server over 20 pairs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_pair_is_three_operations() {
    lock_tests::bounded("an_uncontended_pair_is_three_operations", async move {
        let zk = ZooKeeper::start();
        // A long session: no ping among the packets counted.
        let locks = zookeeper::long_session_client(&zk).await;
        // The first pair creates the queue's container as well.
        locks.lock("pairs").run(async {}).await.expect("first pair");
        let before = zk.monitor(0, "zk_packets_received").expect("mntr");
        for _ in 0..20 {
            locks
                .lock("pairs")
                .acquire()
                .await
                .expect("free")
                .release()
                .await
                .expect("release");
        }
        let packets = zk.monitor(0, "zk_packets_received").expect("mntr") - before;
        // 60, plus the counting `mntr` request itself: a fourth operation
        // per pair would show as 80 or more.
        assert!((60..=62).contains(&packets), "20 pairs took {packets} requests");
    })
    .await
}

/// A client whose session the ensemble expired (cut off past its session
/// timeout) is told its lock is lost, and opens a new session for the
/// locks that follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_its_session_expired_a_client_opens_a_new_one() {
    lock_tests::bounded("after_its_session_expired_a_client_opens_a_new_one", async move {
        let zk = ZooKeeper::start();
        let proxy = lock_tests::Proxy::start(zk.port(0)).await;
        let locks = LockClient::builder()
            .command_timeout(Duration::from_millis(300))
            .zookeeper_session_timeout(SESSION_TIMEOUT)
            .zookeeper(&format!("127.0.0.1:{}", proxy.port()))
            .await
            .expect("connect through the proxy");
        let guard = locks.lock("expiring").acquire().await.expect("acquire");
        proxy.blackhole();
        // The ensemble expires the session: another client gets the lock.
        let rival = zookeeper::client(&zk).await;
        let taken = rival
            .lock("expiring")
            .wait(Duration::from_secs(20))
            .acquire()
            .await
            .expect("the cut-off session expires");
        assert!(!guard.is_held(), "still trusted after its session expired");
        proxy.reset();
        proxy.pass();
        drop(guard);
        // The same client locks again, on a session of its own.
        locks
            .lock("after-expiry")
            .wait(Duration::from_secs(20))
            .run(async {})
            .await
            .expect("a lock on a new session");
        // And it honours the rival's lock: the new session is not the old.
        let refused = locks.lock("expiring").acquire().await;
        assert!(matches!(refused, Err(LockError::Timeout { .. })), "{refused:?}");
        taken.release().await.expect("release");
        locks
            .lock("expiring")
            .wait(Duration::from_secs(5))
            .run(async {})
            .await
            .expect("free again");
    })
    .await
}

/// A waiter whose `wait` runs out, one whose future is dropped, and a
/// try-once call each leave the queue: only the holder's child is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_queue() {
    lock_tests::bounded("a_waiter_that_gives_up_leaves_the_queue", async move {
        let zk = ZooKeeper::start();
        // A session far longer than the test: nothing here is killed. With
        // the suite's 1 s session the try-once call below once did not time
        // out on a loaded machine (a .ci/run, two chains of scenarios
        // beside it): a session that lapses takes the holder's node, and a
        // connection lost for a moment fails the call.
        let locks = zookeeper::long_session_client(&zk).await;
        let holder = lock_tests::guard_from_another_task(&locks, "given-up").await;
        assert_eq!(queue_len(&zk, "given-up").await, 1);
        let timed_out = locks
            .lock("given-up")
            .wait(Duration::from_millis(200))
            .acquire()
            .await;
        assert!(
            matches!(timed_out, Err(LockError::Timeout { .. })),
            "{timed_out:?}"
        );
        let dropped = tokio::time::timeout(
            Duration::from_millis(200),
            locks.lock("given-up").wait(Duration::from_secs(30)).acquire(),
        )
        .await;
        assert!(dropped.is_err(), "the lock is held");
        let tried = locks.lock("given-up").acquire().await;
        assert!(matches!(tried, Err(LockError::Timeout { .. })), "{tried:?}");
        // The dropped one's child goes from a spawned task.
        let mut left = 0;
        for _ in 0..200 {
            left = queue_len(&zk, "given-up").await;
            if left == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(left, 1, "children of waiters that gave up are left in the queue");
        holder.release().await.expect("release");
    })
    .await
}

/// Waiters get the lock in the order they joined the queue, whether they
/// asked for `fair` or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_the_lock_in_the_order_they_queued() {
    lock_tests::bounded("waiters_get_the_lock_in_the_order_they_queued", async move {
        let zk = ZooKeeper::start();
        let locks = zookeeper::client(&zk).await;
        let holder = locks.lock("line").acquire().await.expect("holder");
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..5 {
            let (locks, order) = (locks.clone(), Arc::clone(&order));
            waiters.push(tokio::spawn(async move {
                // `fair` or not, one queue: a ZooKeeper lock is fair.
                locks
                    .lock("line")
                    .fair(i % 2 == 1)
                    .wait(Duration::from_secs(30))
                    .run(async { order.lock().expect("order").push(i) })
                    .await
            }));
            // Queued before the next one starts.
            assert!(
                until(Duration::from_secs(10), || zk.monitor(0, "zk_watch_count")
                    == Some(i + 1))
                .await
            );
        }
        holder.release().await.expect("release");
        for w in waiters {
            w.await.expect("join").expect("lock");
        }
        assert_eq!(*order.lock().expect("order"), vec![0, 1, 2, 3, 4]);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_is_let_go_when_its_session_expires() {
    lock_tests::bounded("a_killed_holder_is_let_go_when_its_session_expires", async move {
        let zk = ZooKeeper::start();
        let locks = zookeeper::client(&zk).await;
        let target = zookeeper::target(&zk);
        for trial in 0..3 {
            let key = format!("killed:{trial}");
            // A lease far longer than the session: the session decides.
            let holder = lock_tests::lab::Holder::spawn(&target, &key, Duration::from_secs(60), true);
            assert!(matches!(
                locks.lock(key.as_str()).acquire().await,
                Err(LockError::Timeout { .. })
            ));
            holder.kill();
            let killed = Instant::now();
            let guard = locks
                .lock(key.as_str())
                .wait(Duration::from_secs(20))
                .acquire()
                .await
                .expect("the dead holder's session expires");
            let waited = killed.elapsed();
            // Its client pinged at most a third of the session ago, so the
            // ensemble cannot have let go sooner than two thirds of it.
            assert!(
                waited >= SESSION_TIMEOUT * 2 / 3 - zookeeper::TICK,
                "taken {waited:?} after the kill, before the session could expire"
            );
            assert!(waited <= SESSION_TIMEOUT * 4, "let go only after {waited:?}");
            guard.release().await.expect("release");
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_stopped_past_its_session_is_told_lost_and_never_acts_again() {
    lock_tests::bounded(
        "a_holder_stopped_past_its_session_is_told_lost_and_never_acts_again",
        async move {
            let zk = ZooKeeper::start();
            let locks = zookeeper::client(&zk).await;
            for trial in 0..3 {
                let board = Board::new();
                let key = format!("stopped:{trial}");
                // A lease far longer than the session: the session decides.
                let late = lock_tests::lab::acts_after_a_takeover(
                    &zookeeper::target(&zk),
                    &locks,
                    &board,
                    &key,
                    Duration::from_secs(30),
                )
                .await;
                assert_eq!(
                    late, 0,
                    "trial {trial}: the stopped holder acted after the lock was taken over"
                );
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_strictly_increase_over_a_thousand_acquisitions_from_three_processes() {
    lock_tests::bounded(
        "fencing_tokens_strictly_increase_over_a_thousand_acquisitions_from_three_processes",
        async move {
            let zk = ZooKeeper::start();
            let dir = tempfile::tempdir().expect("dir");
            let log = dir.path().join("fence-log");
            let target = zookeeper::target(&zk);
            tokio::task::block_in_place(|| {
                let workers: Vec<_> = ["334", "333", "333"]
                    .iter()
                    .map(|n| {
                        worker_command()
                            .args(["fence", &target, "fenced", n])
                            .env("LOCK_WORKER_FENCE_FILE", &log)
                            .stderr(Stdio::inherit())
                            .spawn()
                            .expect("spawn worker")
                    })
                    .collect();
                for mut w in workers {
                    assert!(w.wait().expect("worker exit").success(), "worker failed");
                }
            });
            let tokens: Vec<u64> = std::fs::read_to_string(&log)
                .expect("fence log")
                .lines()
                .map(|l| l.parse().expect("token"))
                .collect();
            lock_tests::lab::assert_strictly_increasing(&tokens);
        },
    )
    .await
}

/// A client of `zk` whose session outlasts `session` without an answer
/// (the ensemble grants up to 20 s).
async fn patient_client(zk: &ZooKeeper, session: Duration) -> LockClient {
    LockClient::builder()
        .zookeeper_session_timeout(session)
        .zookeeper(&zk.connect_string())
        .await
        .expect("connect")
}

/// DESIGN §11: each member of a 3-member ensemble killed in turn (the
/// followers, then the leader; so also whichever member each client is
/// connected to) under a locking load: no call fails, no two bodies
/// overlap, bodies go on running with each member dead, and a lock held
/// across every fault keeps its body running. A member's death reaches the
/// client as a reset connection or an EOF, retried like a timeout (it
/// failed the call with `Backend { .. "Connection reset by peer" }` before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ensemble_keeps_locking_through_each_member_killed_in_turn() {
    lock_tests::bounded(
        "an_ensemble_keeps_locking_through_each_member_killed_in_turn",
        async move {
            let mut zk = ZooKeeper::ensemble();
            // The holder's session rides out three member deaths, one of
            // them the leader's: an election and a reconnection each, which
            // took more than 6 s once on this 2-core machine (the lease, capped
            // at the session, then ran out: `Lost`, as it must). The load's
            // calls wait 30 s and need no more than 6.
            let a = patient_client(&zk, Duration::from_secs(15)).await;
            let (b, c) = (
                patient_client(&zk, Duration::from_secs(6)).await,
                patient_client(&zk, Duration::from_secs(6)).await,
            );
            // A body holds a lock across every fault.
            let done = Arc::new(tokio::sync::Notify::new());
            let held = tokio::spawn({
                let (a, done) = (a.clone(), Arc::clone(&done));
                async move { a.lock("through").run(done.notified()).await }
            });
            let load = LockingLoad::start(&[b.clone(), c.clone()], 2, "busy");
            assert!(
                load.more_bodies(10, Duration::from_secs(60)).await,
                "no bodies ran on a healthy ensemble"
            );

            let leader = zk.leader().expect("a leader");
            let mut order: Vec<usize> = (0..zk.len()).filter(|&i| i != leader).collect();
            order.push(leader);
            for member in order {
                let role = if member == leader { "leader" } else { "follower" };
                zk.kill(member);
                assert!(
                    load.more_bodies(10, Duration::from_secs(60)).await,
                    "no bodies ran with the {role} (member {member}) dead"
                );
                // Back before the next dies: two of three form the quorum.
                tokio::task::block_in_place(|| zk.revive(member));
            }
            let (runs, longest_gap) = load.finish().await;
            done.notify_one();
            held.await
                .expect("join")
                .expect("the body held its lock through every member dying");
            // New acquisitions work on the ensemble as it is now.
            b.lock("after")
                .wait(Duration::from_secs(10))
                .run(async {})
                .await
                .expect("a lock after the faults");
            eprintln!("ensemble: {runs} bodies, longest pause {longest_gap:?} across the faults");
        },
    )
    .await
}

/// A client made while the ensemble has no quorum (two members of three
/// down, as during an election) waits within its call's `wait` for the
/// ensemble to serve, rather than failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_made_while_the_ensemble_has_no_quorum_waits_for_it() {
    lock_tests::bounded(
        "a_call_made_while_the_ensemble_has_no_quorum_waits_for_it",
        async move {
            let mut zk = ZooKeeper::ensemble();
            zk.kill(1);
            zk.kill(2);
            let locks = LockClient::builder()
                .lazy()
                .zookeeper_session_timeout(Duration::from_secs(6))
                .zookeeper(&zk.connect_string())
                .await
                .expect("a lazy client connects on first use");
            let call = tokio::spawn({
                let locks = locks.clone();
                async move {
                    locks
                        .lock("electing")
                        .wait(Duration::from_secs(60))
                        .run(async {})
                        .await
                }
            });
            tokio::task::block_in_place(|| zk.revive(1));
            tokio::time::timeout(Duration::from_secs(90), call)
                .await
                .expect("bounded")
                .expect("join")
                .expect("the call waited for the quorum");
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cut_off_stops_its_body_before_the_session_can_expire() {
    lock_tests::bounded(
        "a_session_cut_off_stops_its_body_before_the_session_can_expire",
        async move {
            let zk = ZooKeeper::start();
            let rival = zookeeper::client(&zk).await;
            let proxy = lock_tests::Proxy::start(zk.port(0)).await;
            let holder = LockClient::builder()
                .command_timeout(Duration::from_millis(200))
                .zookeeper_session_timeout(SESSION_TIMEOUT)
                .zookeeper(&format!("127.0.0.1:{}", proxy.port()))
                .await
                .expect("connect through the proxy");
            // The lock is free: the wait only lets a first attempt that a
            // loaded machine answered past the 200 ms command timeout be
            // tried again.
            let guard = holder
                .lock("cut")
                .ttl(Duration::from_secs(60))
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .expect("acquire");
            // The lease is the session, not the 60 s asked for.
            let left = guard
                .valid_until()
                .into_std()
                .saturating_duration_since(Instant::now());
            assert!(left <= SESSION_TIMEOUT, "trusted for {left:?}");
            proxy.blackhole();
            let cut = Instant::now();
            let rival_got = tokio::spawn(async move {
                let g = rival
                    .lock("cut")
                    .wait(Duration::from_secs(20))
                    .acquire()
                    .await
                    .expect("the cut-off session expires");
                (Instant::now(), g)
            });
            assert!(
                until(Duration::from_secs(10), || !guard.is_held()).await,
                "the cut-off holder still believes it holds the lock"
            );
            // The lease was never trusted past the session timeout from the
            // last request answered before the cut, and the rival got in
            // only after that deadline.
            let deadline = guard.valid_until().into_std();
            assert!(
                deadline <= cut + SESSION_TIMEOUT,
                "trusted {:?} past the cut",
                deadline - cut
            );
            let (entered, g) = rival_got.await.expect("join");
            assert!(
                deadline <= entered,
                "the rival entered {:?} before the holder's deadline",
                deadline - entered
            );
            g.release().await.expect("release");
            proxy.pass();
        },
    )
    .await
}

/// A release whose request the connection loses is completed once the
/// client is back on the ensemble: the child would otherwise keep the lock
/// for as long as the session lives (here 20 s, which the rival does not
/// wait for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_lost_with_its_connection_is_completed_when_it_comes_back() {
    lock_tests::bounded(
        "a_release_lost_with_its_connection_is_completed_when_it_comes_back",
        async move {
            let zk = ZooKeeper::start();
            let rival = zookeeper::client(&zk).await;
            let proxy = lock_tests::Proxy::start(zk.port(0)).await;
            let holder = LockClient::builder()
                .command_timeout(Duration::from_millis(300))
                .zookeeper_session_timeout(Duration::from_secs(20))
                .zookeeper(&format!("127.0.0.1:{}", proxy.port()))
                .await
                .expect("connect through the proxy");
            let guard = holder.lock("lost-release").acquire().await.expect("acquire");
            proxy.blackhole();
            // The delete goes into the blackhole; the connection is then
            // closed with it unanswered, and opened again.
            let _ = guard.release().await;
            proxy.reset();
            proxy.pass();
            let started = Instant::now();
            let taken = rival
                .lock("lost-release")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .expect("the release went through once the connection was back");
            assert!(started.elapsed() < Duration::from_secs(10));
            taken.release().await.expect("release");
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_deleted_by_an_operator_is_lost_not_kept() {
    lock_tests::bounded("a_lock_deleted_by_an_operator_is_lost_not_kept", async move {
        let zk = ZooKeeper::start();
        let locks = zookeeper::client(&zk).await;
        let outcome = locks
            .lock("deleted")
            .run(async {
                let operator = zookeeper_client::Client::connect(&zk.connect_string())
                    .await
                    .expect("operator session");
                let queue = "/distributed-locks/lock:{deleted}";
                for child in operator.list_children(queue).await.expect("queue") {
                    operator
                        .delete(&format!("{queue}/{child}"), None)
                        .await
                        .expect("delete");
                }
                std::future::pending::<()>().await
            })
            .await;
        assert!(
            matches!(
                outcome,
                Err(LockError::Lost {
                    reason: LostReason::TakenOver,
                    ..
                })
            ),
            "{outcome:?}"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors() {
    lock_tests::bounded("bad_input_gets_clear_errors", async move {
        let zk = ZooKeeper::start();
        for root in ["locks", "/", "/a/", "/a//b"] {
            let err = LockClient::builder()
                .zookeeper_root(root)
                .zookeeper(&zk.connect_string())
                .await
                .expect_err("a bad root");
            assert!(
                matches!(err, LockError::InvalidConfig { ref reason, .. } if reason.contains(root)),
                "{err}"
            );
        }
        let err = LockClient::zookeeper("").await.expect_err("empty");
        assert!(matches!(err, LockError::InvalidConfig { .. }), "{err}");
        // Nothing listens there: waited for up to the start-up timeout,
        // then an error naming it and what it last said.
        let dead = format!("127.0.0.1:{}", lock_tests::server::free_port());
        let err = LockClient::builder()
            .zookeeper_session_timeout(SESSION_TIMEOUT)
            .startup_timeout(Duration::from_millis(500))
            .zookeeper(&dead)
            .await
            .expect_err("nothing listens");
        assert!(err.to_string().contains(&dead), "{err}");
        assert!(err.to_string().contains("not ready within 500ms"), "{err}");

        let locks = zookeeper::client(&zk).await;
        // Any key is a node name: slashes, dots, percent signs, non-ASCII.
        for key in ["a/b/c", "..", "%2F", "ключ", "x y"] {
            locks
                .lock(key)
                .run(async {})
                .await
                .unwrap_or_else(|e| panic!("{key:?}: {e}"));
        }
        // And an operator's list reads each back as it was given.
        let mut held = Vec::new();
        for key in ["a/b/c", "..", "%2F", "ключ", "x y"] {
            held.push(locks.lock(key).acquire().await.expect("free"));
        }
        let listed: Vec<String> = locks
            .admin()
            .list(None)
            .await
            .expect("list")
            .into_iter()
            .map(|lock| lock.key)
            .collect();
        assert_eq!(listed, ["%2F", "..", "a/b/c", "x y", "ключ"]);
        for guard in held {
            guard.release().await.expect("release");
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_are_taken_queue_by_queue_and_given_back_on_failure() {
    lock_tests::bounded(
        "sets_are_taken_queue_by_queue_and_given_back_on_failure",
        async move {
            let zk = ZooKeeper::start();
            let locks = zookeeper::client(&zk).await;
            let blocker = lock_tests::guard_from_another_task(&locks, "set:c").await;
            let err = locks
                .lock_all(["set:a", "set:b", "set:c"])
                .wait(Duration::from_millis(200))
                .acquire()
                .await
                .expect_err("c is held");
            assert!(
                matches!(err, LockError::Timeout { ref key, .. } if key == "set:c"),
                "{err}"
            );
            // What it took on the way was given back.
            for key in ["set:a", "set:b"] {
                locks.lock(key).run(async {}).await.expect("given back");
            }
            blocker.release().await.expect("release");
            let all = locks
                .lock_all(["set:c", "set:a", "set:b"])
                .acquire()
                .await
                .expect("all three");
            assert_eq!(all.keys().count(), 3);
            all.release().await.expect("release");
            assert_eq!(queue_len(&zk, "set:a").await, 0);
        },
    )
    .await
}

/// The ensemble grants at most its `maxSessionTimeout` (20 s here), whatever
/// the client asks: a lease is trusted for the session granted, not the one
/// asked. Trusted for the 30 s asked, a holder cut off from the ensemble
/// would run its body 10 s after its session, and its lock, had ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_trusted_for_the_session_granted_not_the_one_asked() {
    lock_tests::bounded(
        "a_lease_is_trusted_for_the_session_granted_not_the_one_asked",
        async move {
            let zk = ZooKeeper::start();
            let asked = Duration::from_secs(30);
            let granted = Duration::from_secs(20);
            let locks = LockClient::builder()
                .zookeeper_session_timeout(asked)
                .zookeeper(&zk.connect_string())
                .await
                .expect("connect");
            let (from_ask, left) = lock_tests::first_lease(&locks, "granted", Duration::from_secs(60)).await;
            assert!(
                left <= granted,
                "trusted for {left:?}: more than the {granted:?} session granted"
            );
            // Not cut to nothing either: the lease is the whole session.
            assert!(from_ask > granted / 2, "trusted for only {from_ask:?}");
        },
    )
    .await
}

/// A nested call asking for a longer ttl than the enclosing one lengthens
/// the lease, but only as far as the session: trusted for the 60 s it asked,
/// a holder cut off mid-body would run on long after the ensemble ended its
/// session and let a rival in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_call_is_trusted_no_longer_than_the_session() {
    lock_tests::bounded(
        "a_nested_call_is_trusted_no_longer_than_the_session",
        async move {
            let zk = ZooKeeper::start();
            // Long enough that a starved machine still takes the outer
            // lock and makes the nested call within the outer 3 s.
            let session = Duration::from_secs(9);
            let locks = LockClient::builder()
                .zookeeper_session_timeout(session)
                .zookeeper(&zk.connect_string())
                .await
                .expect("connect");
            let (lengthened, left) = lock_tests::nested_extension(
                &locks,
                "nested",
                Duration::from_secs(3),
                Duration::from_secs(60),
            )
            .await;
            assert!(
                left <= session,
                "the nested call's lease is trusted for {left:?}, past the {session:?} session"
            );
            assert!(
                lengthened > Duration::from_secs(6),
                "not lengthened past the outer call's 3 s: {lengthened:?}"
            );
        },
    )
    .await
}

/// `zookeeper_digest`: the session authenticates, and every lock node it
/// creates (the root, the queue, the holder's node) gives all permissions
/// to that identity alone. Another identity, and a session with none, can
/// neither delete nor change the holder's node, nor join or list its queue,
/// nor delete the queue; the lock stays held. A second client of the same
/// identity waits and gets it. A wrong password (another identity, to
/// ZooKeeper) is refused at start-up, and no password shows. With
/// `zookeeper_readable_by_anyone`, anyone may list and read, never write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_identity_keeps_its_lock_nodes_from_every_other_client() {
    use lock_tests::secrets::assert_no_password;
    use zookeeper_client as zk;
    lock_tests::bounded(
        "a_digest_identity_keeps_its_lock_nodes_from_every_other_client",
        async move {
            let zk = ZooKeeper::start();
            let connect = zk.connect_string();
            const PASSWORD: &str = "Zq7@/#?:%Wv3";
            let secured = |root: &str, password: &str| {
                LockClient::builder()
                    .zookeeper_root(root)
                    .zookeeper_digest("locks", password)
            };
            let session = async |auth: Option<String>| {
                let mut connector = zk::Client::connector();
                if let Some(auth) = auth {
                    connector = connector.with_auth("digest", auth.as_bytes());
                }
                connector.connect(&connect).await.expect("a session")
            };
            let owner = session(Some(format!("locks:{PASSWORD}"))).await;
            let mallory = session(Some("mallory:Pa55".into())).await;
            let anonymous = session(None).await;

            let locks = secured("/secured", PASSWORD)
                .zookeeper(&connect)
                .await
                .expect("connect as `locks`");
            let guard = locks.lock("k").acquire().await.expect("acquire");
            let queue = "/secured/lock:{k}";
            let children = owner.list_children(queue).await.expect("the owner lists");
            assert_eq!(children.len(), 1, "{children:?}");
            let node = format!("{queue}/{}", children[0]);
            let anyone = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
            for (who, intruder) in [("another identity", &mallory), ("no identity", &anonymous)] {
                let refused = |r: Result<(), zk::Error>, what: &str| {
                    assert!(matches!(r, Err(zk::Error::NoAuth)), "{who} could {what}: {r:?}");
                };
                refused(intruder.delete(&node, None).await, "delete the holder's node");
                refused(
                    intruder.set_data(&node, b"mine", None).await.map(drop),
                    "change the holder's node",
                );
                refused(
                    intruder
                        .create(&format!("{queue}/intruder_"), &[], &anyone)
                        .await
                        .map(drop),
                    "join the queue",
                );
                refused(intruder.list_children(queue).await.map(drop), "list the queue");
                refused(intruder.delete(queue, None).await, "delete the queue");
                refused(
                    intruder
                        .create(
                            "/secured/lock:{other}",
                            &[],
                            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
                        )
                        .await
                        .map(drop),
                    "create a queue under the root",
                );
            }
            // The root cannot be deleted (and made again, open): its
            // `owner` node keeps it from ever being empty.
            // (Deleting it is checked against `/`'s ACL, not its own.)
            let r = anonymous.delete("/secured", None).await;
            assert!(matches!(r, Err(zk::Error::NotEmpty)), "the secured root: {r:?}");
            assert!(guard.is_held(), "an intruder's attempts cost the holder its lock");
            assert_eq!(
                owner.list_children(queue).await.expect("the owner lists").len(),
                1
            );

            let other = secured("/secured", PASSWORD)
                .zookeeper(&connect)
                .await
                .expect("a second client of the same identity");
            let waiting =
                tokio::spawn(
                    async move { other.lock("k").wait(Duration::from_secs(10)).run(async {}).await },
                );
            // Until the waiter stands in the queue behind the holder.
            let deadline = Instant::now() + Duration::from_secs(10);
            while owner.list_children(queue).await.map_or(0, |c| c.len()) < 2 {
                assert!(Instant::now() < deadline, "the second client never queued");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            guard.release().await.expect("release");
            tokio::time::timeout(Duration::from_secs(15), waiting)
                .await
                .expect("the waiter of the same identity got in")
                .expect("join")
                .expect("lock after release");

            let wrong = secured("/secured", "Zq7-wrong-Wv3")
                .zookeeper(&connect)
                .await
                .expect_err("a wrong password is another identity");
            assert!(matches!(wrong, LockError::InvalidConfig { .. }), "{wrong}");
            assert!(
                wrong
                    .to_string()
                    .contains("may not create nodes under `/secured`"),
                "{wrong}"
            );
            assert_no_password("a refused identity's error", &format!("{wrong} {wrong:?}"));
            assert_no_password("a client's Debug", &format!("{locks:?}"));
            let err = LockClient::builder()
                .zookeeper_digest("locks:Zq7-Wv3", "")
                .zookeeper(&connect)
                .await
                .expect_err("a user name with `:`");
            assert!(matches!(err, LockError::InvalidConfig { .. }), "{err}");
            assert_no_password("a user name holding a password", &format!("{err} {err:?}"));
            // Readers to restrict need an identity whose nodes they are.
            let err = LockClient::builder()
                .zookeeper_readable_by_anyone(true)
                .zookeeper(&connect)
                .await
                .expect_err("readers without an identity");
            assert!(matches!(err, LockError::InvalidConfig { .. }), "{err}");
            // A root made open before the identity was set is refused.
            anonymous
                .create(
                    "/open",
                    &[],
                    &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
                )
                .await
                .expect("an open root");
            let err = secured("/open", PASSWORD)
                .zookeeper(&connect)
                .await
                .expect_err("an open root");
            assert!(err.to_string().contains("lets anyone change it"), "{err}");

            let open = secured("/readable", PASSWORD)
                .zookeeper_readable_by_anyone(true)
                .zookeeper(&connect)
                .await
                .expect("connect, readable by anyone");
            let held = open.lock("k").acquire().await.expect("acquire");
            let queue = "/readable/lock:{k}";
            let listed = anonymous.list_children(queue).await.expect("anyone may list");
            assert_eq!(listed.len(), 1, "{listed:?}");
            let node = format!("{queue}/{}", listed[0]);
            anonymous.get_data(&node).await.expect("anyone may read");
            for (who, reader) in [("another identity", &mallory), ("no identity", &anonymous)] {
                let r = reader.delete(&node, None).await;
                assert!(
                    matches!(r, Err(zk::Error::NoAuth)),
                    "{who} deleted the holder's node: {r:?}"
                );
                let r = reader.set_data(&node, b"mine", None).await.map(drop);
                assert!(
                    matches!(r, Err(zk::Error::NoAuth)),
                    "{who} changed the holder's node: {r:?}"
                );
                let r = reader
                    .create(&format!("{queue}/intruder_"), &[], &anyone)
                    .await
                    .map(drop);
                assert!(
                    matches!(r, Err(zk::Error::NoAuth)),
                    "{who} joined the queue: {r:?}"
                );
            }
            assert!(held.is_held());
            held.release().await.expect("release");

            // A root several levels deep: each parent the client makes gets
            // the identity's ACL, so no other client may create or delete
            // under any of them, and the lock's queue sits under the last.
            let deep = secured("/services/shop/locks", PASSWORD)
                .zookeeper(&connect)
                .await
                .expect("connect under a deep root");
            let held = deep.lock("k").acquire().await.expect("acquire");
            for parent in ["/services", "/services/shop", "/services/shop/locks"] {
                let (acls, _) = owner.get_acl(parent).await.expect("read a parent's ACL");
                let ids: Vec<(&str, &str)> = acls.iter().map(|acl| (acl.scheme(), acl.id())).collect();
                assert!(
                    !ids.is_empty()
                        && ids
                            .iter()
                            .all(|(scheme, id)| *scheme == "digest" && id.starts_with("locks:")),
                    "`{parent}` is not the identity's alone: {ids:?}"
                );
                for (who, intruder) in [("another identity", &mallory), ("no identity", &anonymous)] {
                    let r = intruder
                        .create(
                            &format!("{parent}/intruder"),
                            &[],
                            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
                        )
                        .await
                        .map(drop);
                    assert!(
                        matches!(r, Err(zk::Error::NoAuth)),
                        "{who} created a node under `{parent}`: {r:?}"
                    );
                }
            }
            for (child, parent) in [
                ("/services/shop", "/services"),
                ("/services/shop/locks", "/services/shop"),
            ] {
                let r = mallory.delete(child, None).await;
                assert!(
                    matches!(r, Err(zk::Error::NoAuth)),
                    "another identity deleted `{child}` under `{parent}`: {r:?}"
                );
            }
            let queue = owner
                .list_children("/services/shop/locks/lock:{k}")
                .await
                .expect("the queue under the deep root");
            assert_eq!(queue.len(), 1, "{queue:?}");
            held.release().await.expect("release");
        },
    )
    .await
}

/// With `zookeeper_digest`, a chroot the connect string names and nobody
/// made is made by the client with the identity's ACL, as the root is:
/// another identity may neither create under it nor delete it. A
/// `lazy()` client skips the start-up check of its identity; its first
/// lock call under a root another identity owns fails then, at once,
/// saying whose the nodes are, and the lock is not taken. (The chroot
/// itself can be deleted only when empty, which the root under it never
/// is: its parent, `/`, is usually open to all.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chroot_made_by_a_digest_identity_is_its_own_and_a_lazy_client_is_told_at_its_first_call() {
    use zookeeper_client as zk;
    lock_tests::bounded(
        "a_chroot_made_by_a_digest_identity_is_its_own_and_a_lazy_client_is_told_at_its_first_call",
        async move {
            let zk = ZooKeeper::start();
            let connect = zk.connect_string();
            let locks = LockClient::builder()
                .zookeeper_digest("locks", "Pa55-w0rd")
                .zookeeper(&format!("{connect}/tenant"))
                .await
                .expect("connect under a chroot nobody made");
            let held = locks.lock("k").acquire().await.expect("free");
            let owner = zk::Client::connector()
                .with_auth("digest", b"locks:Pa55-w0rd")
                .connect(&connect)
                .await
                .expect("the identity's session");
            let (acls, _) = owner.get_acl("/tenant").await.expect("read the chroot's ACL");
            let ids: Vec<(&str, &str)> = acls.iter().map(|acl| (acl.scheme(), acl.id())).collect();
            assert!(
                !ids.is_empty()
                    && ids
                        .iter()
                        .all(|(scheme, id)| *scheme == "digest" && id.starts_with("locks:")),
                "the chroot is not the identity's alone: {ids:?}"
            );
            let mallory = zk::Client::connector()
                .with_auth("digest", b"mallory:Pa55")
                .connect(&connect)
                .await
                .expect("another identity's session");
            let r = mallory
                .create(
                    "/tenant/intruder",
                    &[],
                    &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
                )
                .await
                .map(drop);
            assert!(
                matches!(r, Err(zk::Error::NoAuth)),
                "another identity created under the chroot: {r:?}"
            );
            // A delete is checked against the parent's ACL: the chroot's.
            let r = mallory.delete("/tenant/distributed-locks", None).await;
            assert!(
                matches!(r, Err(zk::Error::NoAuth)),
                "another identity deleted the root: {r:?}"
            );

            let lazy = LockClient::builder()
                .lazy()
                .zookeeper_digest("mallory", "Pa55")
                .zookeeper(&format!("{connect}/tenant"))
                .await
                .expect("a lazy client starts without a check");
            let started = Instant::now();
            let err = lazy
                .lock("other")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .expect_err("the nodes are another identity's");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "told at once, not at the end of its wait: {:?}",
                started.elapsed()
            );
            assert!(err.to_string().contains("another ZooKeeper identity"), "{err}");
            assert!(held.is_held());
            held.release().await.expect("release");
        },
    )
    .await
}
