//! Start-up: a server that refuses connections or answers but is not
//! serving yet (Redis `LOADING`, PostgreSQL "the database system is
//! starting up", etcd without a leader, a ZooKeeper server that is not
//! running yet) is waited for, up to the client's `startup_timeout`. A
//! service and its servers often start together (a compose file, a pod
//! with a sidecar, a host's reboot), and a client that failed in that
//! window would fail the service for a server seconds from ready.
//! What waiting cannot mend (a bad URL, refused credentials, a certificate
//! that does not verify) fails at once: the backends classify each failure
//! as for a lock call (`Failure::transient`).

use std::future::Future;
use std::time::Duration;

use super::contract::Failure;
use crate::error::{LockError, fmt_duration};

/// The first pause after a failed attempt; each next one doubles, up to
/// [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// A server that has just become ready is found within this.
const LONGEST_PAUSE: Duration = Duration::from_millis(500);

/// The error of a start-up that gave up: what the server last answered,
/// after how long.
#[derive(Debug, thiserror::Error)]
#[error("not ready within {} ({attempts} attempts; `startup_timeout` sets how long to wait), last: {last}", fmt_duration(*limit))]
pub(crate) struct NotReady {
    limit: Duration,
    attempts: u32,
    last: String,
}

/// Runs `attempt` until it succeeds, fails with an error that waiting
/// cannot mend, or `limit` has passed since the first attempt began: an
/// attempt still running then is dropped. A `limit` of zero is one
/// attempt, unbounded but by its own timeouts, whose error is returned as
/// it is.
pub(crate) async fn when_ready<T, Fut>(
    node: &str,
    limit: Duration,
    mut attempt: impl FnMut() -> Fut,
) -> Result<T, LockError>
where
    Fut: Future<Output = Result<T, Failure>>,
{
    if limit.is_zero() {
        return attempt().await.map_err(LockError::from);
    }
    let deadline = tokio::time::Instant::now() + limit;
    let mut pause = FIRST_PAUSE;
    let mut attempts = 0u32;
    let not_ready = |attempts: u32, last: String| {
        LockError::backend(
            node,
            None,
            NotReady {
                limit,
                attempts,
                last,
            },
        )
    };
    // What the last attempt that ended said.
    let mut last = None;
    loop {
        attempts += 1;
        let failure = match tokio::time::timeout_at(deadline, attempt()).await {
            Ok(Ok(ready)) => return Ok(ready),
            Ok(Err(failure)) => failure,
            Err(_) => {
                let last = last.unwrap_or_else(|| "no answer yet".to_owned());
                return Err(not_ready(attempts, last));
            }
        };
        if !failure.transient {
            return Err(failure.error);
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(not_ready(attempts, last_seen(&failure.error)));
        }
        if attempts == 1 {
            tracing::info!(
                node,
                error = %failure.error,
                limit = %fmt_duration(limit),
                "lock server not ready; waiting for it"
            );
        }
        last = Some(last_seen(&failure.error));
        // A pause between attempts, not a synchronisation: nothing says
        // when a starting server is ready but its answers.
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

/// A start-up attempt the server did not answer within `within`: a server
/// still starting, worth waiting for.
#[cfg(any(feature = "mysql", feature = "postgres", feature = "zookeeper"))]
pub(crate) fn no_answer(node: &str, within: Duration) -> Failure {
    Failure {
        error: LockError::backend(node, None, format!("no answer within {}ms", within.as_millis())),
        transient: true,
        reconnecting: false,
    }
}

/// Whether `error` or one of its causes is TLS refusing the connection:
/// rustls reports a handshake it refused (an unknown issuer, a name
/// mismatch, a reply that is not TLS) as an I/O error of kind
/// `InvalidData`, which a refused, reset or closed connection never is.
pub(crate) fn tls_refused(error: &(dyn std::error::Error + 'static)) -> bool {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut cause = Some(error);
    while let Some(c) = cause {
        // The redis crate keeps an I/O error behind an `Arc`, whose
        // `source` is the I/O error's own (not the I/O error): look
        // through it.
        let io = c.downcast_ref::<std::io::Error>().or_else(|| {
            c.downcast_ref::<Shared>()
                .and_then(|shared| shared.downcast_ref::<std::io::Error>())
        });
        if io.is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData) {
            return true;
        }
        cause = c.source();
    }
    false
}

/// An error and each of its causes that it does not already say: the
/// drivers repeat their own words ("error performing TLS handshake") and
/// keep the reason (rustls's unknown issuer) at the bottom of the chain.
#[cfg(any(feature = "mysql", feature = "postgres", feature = "etcd"))]
pub(crate) fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        cause = c.source();
    }
    text
}

/// What a failure said, without the node `LockError::Backend` names
/// again in its own message.
fn last_seen(error: &LockError) -> String {
    match error {
        LockError::Backend { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn transient(n: u32) -> Failure {
        Failure {
            error: LockError::backend("n:1", None, format!("refused {n}")),
            transient: true,
            reconnecting: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_becomes_ready_is_waited_for() {
        let tries = Cell::new(0);
        let began = tokio::time::Instant::now();
        let ready = when_ready("n:1", Duration::from_secs(10), || {
            tries.set(tries.get() + 1);
            let n = tries.get();
            async move { if n < 5 { Err(transient(n)) } else { Ok(n) } }
        })
        .await
        .expect("ready on the fifth attempt");
        assert_eq!(ready, 5);
        // 50 + 100 + 200 + 400 ms of pauses.
        assert_eq!(began.elapsed(), Duration::from_millis(750));
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_never_ready_fails_at_the_limit_saying_what_it_last_saw() {
        let tries = Cell::new(0);
        let began = tokio::time::Instant::now();
        let error = when_ready("n:1", Duration::from_secs(2), || {
            tries.set(tries.get() + 1);
            let n = tries.get();
            async move { Err::<(), _>(transient(n)) }
        })
        .await
        .expect_err("never ready");
        assert_eq!(began.elapsed(), Duration::from_secs(2));
        let n = tries.get();
        assert_eq!(
            error.to_string(),
            format!(
                "lock server `n:1` failed: not ready within 2s ({n} attempts; `startup_timeout` sets how long to wait), last: refused {n}"
            )
        );
    }

    #[tokio::test(start_paused = true)]
    async fn what_waiting_cannot_mend_fails_at_once() {
        let tries = Cell::new(0);
        let error = when_ready("n:1", Duration::from_secs(10), || {
            tries.set(tries.get() + 1);
            async {
                Err::<(), _>(Failure::permanent(LockError::InvalidConfig {
                    node: "n:1".into(),
                    reason: "the server refused the credentials".into(),
                }))
            }
        })
        .await
        .expect_err("refused");
        assert_eq!(tries.get(), 1);
        assert!(matches!(error, LockError::InvalidConfig { .. }), "{error:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_still_running_at_the_limit_is_dropped() {
        let tries = Cell::new(0);
        let began = tokio::time::Instant::now();
        let error = when_ready("n:1", Duration::from_secs(2), || {
            tries.set(tries.get() + 1);
            let n = tries.get();
            async move {
                if n == 1 {
                    return Err::<(), _>(transient(n));
                }
                // A server that accepts and never answers, with no
                // timeout of the attempt's own.
                std::future::pending().await
            }
        })
        .await
        .expect_err("never ready");
        assert_eq!(began.elapsed(), Duration::from_secs(2));
        assert_eq!(
            error.to_string(),
            "lock server `n:1` failed: not ready within 2s (2 attempts; `startup_timeout` sets how long to wait), last: refused 1"
        );
    }

    #[test]
    fn tls_refusals_are_told_from_connection_failures() {
        use std::io::{Error, ErrorKind};
        let tls = Error::new(ErrorKind::InvalidData, "invalid peer certificate: UnknownIssuer");
        assert!(tls_refused(&tls));
        let shared: std::sync::Arc<dyn std::error::Error + Send + Sync> = std::sync::Arc::new(tls);
        assert!(tls_refused(&shared), "behind an Arc, as the redis crate keeps it");
        assert!(!tls_refused(&Error::from(ErrorKind::ConnectionRefused)));
        assert!(!tls_refused(&Error::from(ErrorKind::UnexpectedEof)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_limit_is_one_attempt_and_its_own_error() {
        let tries = Cell::new(0);
        let error = when_ready("n:1", Duration::ZERO, || {
            tries.set(tries.get() + 1);
            async { Err::<(), _>(transient(1)) }
        })
        .await
        .expect_err("not ready");
        assert_eq!(tries.get(), 1);
        assert_eq!(error.to_string(), "lock server `n:1` failed: refused 1");
    }
}
