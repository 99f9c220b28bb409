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
        guard.valid_until() <= latest,
        "trusted {:?} past `before + ttl + 100 ms`: measured from the reply?",
        guard.valid_until() - latest
    );
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_lease_is_trusted_from_before_the_renewal_was_sent() {
    let server = RedisServer::start();
    let (_proxy, locks) = delayed_client(&server).await;
    let ttl = Duration::from_millis(1200);
    let guard = tokio::time::timeout(BOUND, locks.lock("slow-renewal").ttl(ttl).acquire())
        .await
        .expect("bounded")
        .expect("free");
    let first = guard.valid_until();
    // Watch for the first confirmed renewal (due after ttl/3).
    let seen = tokio::time::timeout(BOUND, async {
        loop {
            if guard.valid_until() > first {
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
        guard.valid_until() <= latest,
        "the renewal's deadline is {:?} past `seen + ttl - 100 ms`: measured from the reply?",
        guard.valid_until() - latest
    );
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_arrives_after_its_lease_could_have_expired_is_refused() {
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
}
