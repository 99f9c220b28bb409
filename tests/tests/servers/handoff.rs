//! Handoffs (README: "Throughput"): a release with a waiter in the same
//! process hands the lock straight to it in one owner-checked call; a waiter
//! that stops waiting is never left holding a lock; handed locks exclude and
//! fence like any other; and a release goes through the server after a few
//! handoffs in a row. Against a real `redis-server`, counted by the server.

use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::poll;
use lock_runtime::{LockClient, LockError, LockGuard};
use lock_tests::{RedisServer, commands_between};

async fn client(server: &RedisServer) -> LockClient {
    LockClient::connect(&server.url()).await.expect("connect")
}

fn holder_of(server: &RedisServer, key: &str) -> Option<String> {
    server.query(redis::cmd("GET").arg(format!("lock:{{{key}}}")))
}

fn script_calls(server: &RedisServer) -> u64 {
    server.command_calls().get("evalsha").copied().unwrap_or(0)
}

/// One attempt on a held lock, so that no waiter's attempt meets NOSCRIPT
/// (which would count as a script call of its own).
async fn load_the_acquire_script(locks: &LockClient) {
    let holder = lock_tests::guard_from_another_task(locks, "warm-up").await;
    let refused = lock_tests::refused_elsewhere(locks, "warm-up", |l| l.wait(Duration::ZERO)).await;
    assert!(refused);
    holder.release().await.expect("released");
}

/// A task waiting for `key` with its offer to be handed the lock standing:
/// it has made the attempt it makes after offering (its second script
/// call), so a release from now on finds the offer.
async fn offered_waiter(
    server: &RedisServer,
    locks: &LockClient,
    key: &str,
) -> tokio::task::JoinHandle<LockGuard> {
    let before = script_calls(server);
    let waiter = lock_tests::acquiring_task(locks, key, Duration::from_secs(10));
    let offered =
        lock_tests::eventually(Duration::from_secs(10), || script_calls(server) >= before + 2).await;
    assert!(offered.is_some(), "the waiter never made its second attempt");
    waiter
}

/// A server, a client with its scripts loaded, a holder of `key` and a
/// waiter for it with its offer standing.
async fn held_with_a_waiter(
    key: &str,
) -> (
    RedisServer,
    LockClient,
    LockGuard,
    tokio::task::JoinHandle<LockGuard>,
) {
    let server = RedisServer::start();
    let locks = client(&server).await;
    load_the_acquire_script(&locks).await;
    let holder = lock_tests::guard_from_another_task(&locks, key).await;
    let waiter = offered_waiter(&server, &locks, key).await;
    (server, locks, holder, waiter)
}

#[tokio::test]
async fn a_release_hands_the_lock_to_a_waiter_here_in_one_call() {
    lock_tests::bounded("a_release_hands_the_lock_to_a_waiter_here_in_one_call", async {
        let server = RedisServer::start();
        let locks = client(&server).await;
        load_the_acquire_script(&locks).await;
        // The first round loads the handoff script (NOSCRIPT, then EVAL);
        // the second is counted.
        for round in 0..2 {
            let holder = lock_tests::guard_from_another_task(&locks, "h").await;
            let waiter = offered_waiter(&server, &locks, "h").await;
            let before = server.command_calls();
            holder.release().await.expect("released");
            let handed = waiter.await.expect("waiter task");
            let mut sent = commands_between(&before, &server.command_calls());
            // The waiter's subscription connection leaving the channel,
            // now that nobody here waits: not part of the handoff.
            sent.remove("unsubscribe");
            assert!(handed.is_held());
            if round == 1 {
                // One script call whose GET checks the giver and whose SET
                // gives the lock its new holder and lease: no DEL, no
                // announcement, no attempt by the waiter.
                let expected = [("evalsha", 1), ("get", 1), ("set", 1)];
                assert_eq!(sent, expected.map(|(c, n)| (c.to_owned(), n)).into());
            }
            handed.release().await.expect("the handed lock is released");
            assert_eq!(holder_of(&server, "h"), None);
        }
    })
    .await;
}

/// The stale-holder contract (`stale_holder.rs`) for the handoff: a holder
/// whose lease ended unseen, and whose lock another client has taken, hands
/// nothing to its waiter. Fails with `hand_over.lua`'s owner check removed:
/// the waiter here would then hold the other client's lock.
#[tokio::test]
async fn a_stale_holder_hands_over_nothing_of_a_lock_another_client_took() {
    lock_tests::bounded(
        "a_stale_holder_hands_over_nothing_of_a_lock_another_client_took",
        async {
            let (server, _locks, holder, waiter) = held_with_a_waiter("stale").await;
            let taken = server.take_as_rival("lock:{stale}", Duration::from_secs(20));
            let released = holder.release().await;
            assert!(matches!(released, Err(LockError::NotHeld { .. })), "{released:?}");
            assert_eq!(
                server.rival_lock("lock:{stale}"),
                taken,
                "the stale holder changed the other client's lock (handed it to its waiter?)"
            );
            assert!(
                !waiter.is_finished(),
                "the waiter got a lock another client holds"
            );
            waiter.abort();
        },
    )
    .await;
}

#[tokio::test]
async fn a_waiter_gone_while_its_handoff_was_out_does_not_keep_the_lock() {
    lock_tests::bounded(
        "a_waiter_gone_while_its_handoff_was_out_does_not_keep_the_lock",
        async {
            let (server, locks, holder, waiter) = held_with_a_waiter("gone").await;

            // The release takes the offer and sends the handoff while the
            // server is stopped; the waiter is cancelled before the answer.
            server.pause();
            let mut release = pin!(holder.release());
            assert!(poll!(release.as_mut()).is_pending());
            waiter.abort();
            assert!(waiter.await.expect_err("cancelled").is_cancelled());
            server.resume();
            release.await.expect("the release handed the lock over");

            // Nobody took the handed lock over: it is given back, well
            // before its 30 s lease would have freed it.
            let freed =
                lock_tests::eventually(Duration::from_secs(5), || holder_of(&server, "gone").is_none()).await;
            assert!(freed.is_some(), "the lock handed to a cancelled waiter was kept");
            let again = locks
                .lock("gone")
                .wait(Duration::ZERO)
                .acquire()
                .await
                .expect("free for the next caller");
            again.release().await.expect("released");
        },
    )
    .await;
}

/// A waiter that stopped waiting leaves its offer behind only as withdrawn:
/// with a live waiter queued after it (so the line, and the dead offer at
/// its head, outlive it), the release skips it and hands the lock to the
/// live one, in one call and with nothing given back afterwards.
#[tokio::test]
async fn a_waiter_gone_before_the_release_is_not_handed_the_lock() {
    lock_tests::bounded("a_waiter_gone_before_the_release_is_not_handed_the_lock", async {
        let (server, locks, holder, first) = held_with_a_waiter("left").await;
        // One handoff first, so that no call below meets NOSCRIPT.
        holder.release().await.expect("released");
        let holder = first.await.expect("first waiter");

        let gone = offered_waiter(&server, &locks, "left").await;
        // Finding an offer standing, it joins the line without a command:
        // this test's runtime runs one task at a time, so once this task
        // runs again, it waits with its offer behind the first.
        let live = lock_tests::acquiring_task(&locks, "left", Duration::from_secs(10));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        gone.abort();
        assert!(gone.await.expect_err("cancelled").is_cancelled());

        let before = server.command_calls();
        holder.release().await.expect("released");
        let live = live.await.expect("live waiter");
        assert!(live.is_held());
        let mut sent = commands_between(&before, &server.command_calls());
        sent.remove("unsubscribe");
        // One handoff, to the live waiter; nothing handed to the gone one
        // and given back (a DEL), no attempt by the live one.
        let expected = [("evalsha", 1), ("get", 1), ("set", 1)];
        assert_eq!(sent, expected.map(|(c, n)| (c.to_owned(), n)).into());
        live.release().await.expect("released");
        assert_eq!(holder_of(&server, "left"), None);
    })
    .await;
}

/// Handed locks exclude like acquired ones (the witness and the counter),
/// fencing tokens still grow strictly in the order holders got the lock,
/// and after [`MOST_IN_A_ROW`](8) handoffs a release goes through the
/// server, so that waiters elsewhere get a chance.
#[tokio::test]
async fn handed_locks_exclude_fence_and_give_way_every_few() {
    lock_tests::bounded("handed_locks_exclude_fence_and_give_way_every_few", async {
        let server = RedisServer::start();
        let locks = client(&server).await;
        server.log_every_command();
        const TASKS: usize = 6;
        const EACH: usize = 30;
        let tokens: Arc<Mutex<Vec<u64>>> = Arc::default();
        let inside = Arc::new(Mutex::new(false));
        let workers: Vec<_> = (0..TASKS)
            .map(|_| {
                let (locks, tokens, inside) = (locks.clone(), Arc::clone(&tokens), Arc::clone(&inside));
                tokio::spawn(async move {
                    for _ in 0..EACH {
                        let guard = locks
                            .lock("fenced")
                            .fencing(true)
                            .wait(Duration::from_secs(30))
                            .acquire()
                            .await
                            .expect("acquired");
                        {
                            let mut inside = inside.lock().expect("witness");
                            assert!(!*inside, "two holders at once");
                            *inside = true;
                        }
                        tokens
                            .lock()
                            .expect("tokens")
                            .push(guard.fencing_token().expect("a token"));
                        tokio::task::yield_now().await;
                        *inside.lock().expect("witness") = false;
                        guard.release().await.expect("released");
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.await.expect("worker");
        }
        let tokens = tokens.lock().expect("tokens").clone();
        assert_eq!(tokens.len(), TASKS * EACH);
        for pair in tokens.windows(2) {
            assert!(pair[0] < pair[1], "token {} followed by {}", pair[0], pair[1]);
        }

        // The releases, in the order the server ran them: a handoff names
        // two holder ids, a release one.
        let mut handoffs = 0;
        let mut in_a_row = 0;
        let mut longest = 0;
        // A script's first call meets NOSCRIPT and is sent again as it was,
        // after a SCRIPT LOAD: counted once (a handoff or a release is
        // never sent twice otherwise: its holder ids are its own).
        let mut seen = std::collections::HashSet::new();
        for args in server.commands_logged() {
            if !args.first().is_some_and(|c| c.eq_ignore_ascii_case("evalsha")) || !seen.insert(args.clone())
            {
                continue;
            }
            let holder_ids = args.iter().skip(5).filter(|a| a.contains(':')).count();
            let releases = args.iter().any(|a| a == "publish");
            if holder_ids == 2 && !releases {
                handoffs += 1;
                in_a_row += 1;
                longest = longest.max(in_a_row);
            } else if releases {
                in_a_row = 0;
            }
        }
        assert!(handoffs > 0, "no release was handed over");
        assert!(longest <= 8, "{longest} handoffs in a row");
    })
    .await;
}

/// A task that asks for a lock its client's other tasks already wait for
/// joins them without an attempt of its own (which could only find the
/// lock held) and is handed the lock in its turn.
#[tokio::test]
async fn a_task_that_finds_others_waiting_here_joins_them_without_an_attempt() {
    lock_tests::bounded(
        "a_task_that_finds_others_waiting_here_joins_them_without_an_attempt",
        async {
            let (server, locks, holder, first) = held_with_a_waiter("line").await;
            // Load the handoff script, so that no call below meets NOSCRIPT.
            holder.release().await.expect("released");
            let holder = first.await.expect("first waiter");
            let first = offered_waiter(&server, &locks, "line").await;

            let before = server.command_calls();
            let late = lock_tests::acquiring_task(&locks, "line", Duration::from_secs(10));
            // This test's runtime runs one task at a time: once this task
            // runs again, the late one has gone as far as it can (waiting).
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            holder.release().await.expect("released");
            let first = first.await.expect("first waiter");
            first.release().await.expect("released");
            let late = late.await.expect("late task");
            assert!(late.is_held());
            let mut sent = commands_between(&before, &server.command_calls());
            sent.remove("unsubscribe");
            // Two handoffs (holder to first, first to late), each one
            // script call with its GET and SET; not a command of the late
            // task's own.
            let expected = [("evalsha", 2), ("get", 2), ("set", 2)];
            assert_eq!(sent, expected.map(|(c, n)| (c.to_owned(), n)).into());
            late.release().await.expect("released");
        },
    )
    .await;
}
