//! Where a lease's validity deadline is measured from: before the command
//! is sent, never from its reply. Through a proxy that delays every chunk
//! 100 ms each way, a deadline taken from the reply would be 200 ms too
//! late, past the server's expiry. Each test fails, by name, if the
//! acquire's or the renewal's deadline moves to the reply, or if a grant
//! that came back after the lease could have expired is accepted.

use std::time::{Duration, Instant};

use lock_runtime::{LockClient, LockError};
use lock_tests::{Proxy, RedisServer};

const BOUND: Duration = Duration::from_secs(20);
const ONE_WAY: Duration = Duration::from_millis(100);

async fn delayed_client(server: &RedisServer) -> (Proxy, LockClient) {
    let proxy = Proxy::start(server.port()).await;
    let locks = LockClient::connect(&proxy.url()).await.expect("connect");
    proxy.delay(ONE_WAY);
    (proxy, locks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquired_lease_is_trusted_from_before_the_send_not_from_the_reply() {
    lock_tests::bounded(
        "an_acquired_lease_is_trusted_from_before_the_send_not_from_the_reply",
        async move {
            let server = RedisServer::start();
            let (_proxy, locks) = delayed_client(&server).await;
            let ttl = Duration::from_secs(2);
            let before = Instant::now();
            let guard = tokio::time::timeout(BOUND, locks.lock("slow-link").ttl(ttl).renew(false).acquire())
                .await
                .expect("bounded")
                .expect("free");
            let replied = Instant::now();
            assert!(
                replied - before >= 2 * ONE_WAY,
                "the proxy did not delay the reply"
            );
            // From the send: at most `before + ttl` (less the drift allowance);
            // from the reply: a round trip (200 ms) later. The 100 ms between
            // leaves room for a scheduler stall between `before` and the send.
            let latest = before + ttl + ONE_WAY;
            assert!(
                guard.valid_until().into_std() <= latest,
                "trusted {:?} past `before + ttl + 100 ms`: measured from the reply?",
                guard.valid_until().into_std() - latest
            );
            guard.release().await.expect("release");
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_lease_is_trusted_from_before_the_renewal_was_sent() {
    lock_tests::bounded(
        "a_renewed_lease_is_trusted_from_before_the_renewal_was_sent",
        async move {
            let server = RedisServer::start();
            let (_proxy, locks) = delayed_client(&server).await;
            let ttl = Duration::from_millis(1200);
            let guard = tokio::time::timeout(BOUND, locks.lock("slow-renewal").ttl(ttl).acquire())
                .await
                .expect("bounded")
                .expect("free");
            let first = guard.valid_until().into_std();
            // Watch for the first confirmed renewal (due after ttl/3).
            let seen = tokio::time::timeout(BOUND, async {
                loop {
                    if guard.valid_until().into_std() > first {
                        return Instant::now();
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
            .await
            .expect("a renewal was confirmed");
            // Sent at least one round trip (200 ms) before its reply, which came
            // before `seen`: a deadline from the send is at most `seen + ttl - 200
            // ms`; one from the reply would be within a few ms of `seen + ttl`.
            let latest = seen + ttl - Duration::from_millis(100);
            assert!(
                guard.valid_until().into_std() <= latest,
                "the renewal's deadline is {:?} past `seen + ttl - 100 ms`: measured from the reply?",
                guard.valid_until().into_std() - latest
            );
            guard.release().await.expect("release");
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_arrives_after_its_lease_could_have_expired_is_refused() {
    lock_tests::bounded(
        "a_grant_that_arrives_after_its_lease_could_have_expired_is_refused",
        async move {
            let server = RedisServer::start();
            let proxy = Proxy::start(server.port()).await;
            let locks = LockClient::connect(&proxy.url()).await.expect("connect");
            // A round trip of at least 300 ms against a 200 ms lease.
            proxy.delay(Duration::from_millis(150));
            let late = tokio::time::timeout(
                BOUND,
                locks.lock("late-grant").ttl(Duration::from_millis(200)).acquire(),
            )
            .await
            .expect("bounded");
            assert!(
                matches!(late, Err(LockError::Backend { .. })),
                "a lease that may already have expired was handed out: {late:?}"
            );
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_against_a_stalled_server_gets_only_what_is_left_of_the_wait() {
    lock_tests::bounded(
        "a_retry_against_a_stalled_server_gets_only_what_is_left_of_the_wait",
        async move {
            let server = RedisServer::start();
            let rival = LockClient::connect(&server.url()).await.expect("connect");
            let held = rival.lock("stalled").acquire().await.expect("free");
            let locks = LockClient::builder()
                .command_timeout(Duration::from_secs(3))
                .connect(&server.url())
                .await
                .expect("connect");
            let wait = Duration::from_millis(500);
            let started = Instant::now();
            let waiting =
                tokio::spawn(async move { locks.lock("stalled").wait(wait).acquire().await.map(drop) });
            // The first attempt found the lock held and the waiter subscribed: its
            // next attempt goes to a server that no longer answers.
            lock_tests::until_waiting(&server, "stalled").await;
            server.pause();
            let outcome = tokio::time::timeout(BOUND, waiting).await;
            let took = started.elapsed();
            server.resume();
            let outcome = outcome.expect("bounded").expect("join");
            // Seen held, then a retry that ran out of wait: the caller waited
            // its whole `wait` for a held lock, whatever the stalled server
            // did with the last attempt.
            assert!(
                matches!(outcome, Err(LockError::Timeout { ref key, .. }) if key == "stalled"),
                "the lock is held: {outcome:?}"
            );
            // What is left of `wait` (at least 10 ms a retry) bounds the call; a
            // retry given the whole 3 s command timeout would take past 3 s.
            assert!(
                took < wait + Duration::from_millis(700),
                "a 500 ms wait took {took:?} against a stalled server"
            );
            held.release().await.expect("release");
        },
    )
    .await
}

/// A holder process stopped (SIGSTOP) past its lease and continued after
/// another took the lock: its body is dropped before it takes one more
/// step, though every timer of the process comes due at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_stopped_past_its_lease_never_acts_again() {
    lock_tests::bounded("a_holder_stopped_past_its_lease_never_acts_again", async move {
        let server = RedisServer::start();
        let locks = LockClient::connect(&server.url()).await.expect("connect");
        for trial in 0..3 {
            // A board per trial: registers of different keys may share a
            // slot, and Redis counts tokens per key.
            let board = lock_tests::lab::Board::new();
            let key = format!("stopped:{trial}");
            let late = lock_tests::lab::acts_after_a_takeover(
                &server.url(),
                &locks,
                &board,
                &key,
                Duration::from_millis(300),
            )
            .await;
            assert_eq!(
                late, 0,
                "trial {trial}: the stopped holder acted after the lock was taken over"
            );
        }
    })
    .await
}
