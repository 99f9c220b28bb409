//! The owner of one acquisition: the release that must happen on every exit
//! path, and the extension a nested call may ask for. Above the shared
//! client state, because both send commands.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::drop_guard::{Cleanup, DropGuard};
use crate::error::{LockError, LostReason};
use crate::lease_state::LeaseState;
use crate::shared::ClientInner;
use crate::spec::Kind;

/// The owner of an acquisition. Releasing consumes it; dropping it without a
/// release (a cancelled future, an early drop of a guard) sends the release
/// from the runtime the lock was taken on (see [`DropGuard`]).
#[derive(Debug)]
pub(crate) struct Lease {
    state: Arc<LeaseState>,
    release: DropGuard<Release>,
}

impl Lease {
    pub(crate) fn new(client: Arc<ClientInner>, state: Arc<LeaseState>) -> Self {
        Lease {
            release: DropGuard::new(Release {
                client,
                state: Arc::clone(&state),
            }),
            state,
        }
    }

    pub(crate) fn state(&self) -> &Arc<LeaseState> {
        &self.state
    }

    /// Releases the lock and reports how that went. If this future is itself
    /// dropped before the server answered, the drop guard sends the release
    /// again (it is owner-checked, so a duplicate is harmless).
    pub(crate) async fn release(mut self) -> Result<(), LockError> {
        let result = self.release.run().await;
        self.release.disarm();
        result
    }
}

/// Sending the release of one lease.
#[derive(Debug)]
struct Release {
    client: Arc<ClientInner>,
    state: Arc<LeaseState>,
}

impl Cleanup for Release {
    async fn run(&self) -> Result<(), LockError> {
        let (client, state) = (&self.client, &self.state);
        state.end();
        match client.backend.release(&state.key, &state.holder).await {
            Ok(true) => {
                tracing::debug!(key = %state.key.name, lock = state.name, holder = %state.holder, "lock released");
                // Waiters in this process retry now, without waiting for the
                // server's notification to come back.
                if state.kind == Kind::Fair {
                    // The server names the next in line; in-process, the
                    // line's waiters look again and the first gets it.
                    if !client.backend.announces_releases() {
                        client.notifier.wake_line(&state.key.channel);
                    }
                } else {
                    client.notifier.released_by(&state.key.channel, &state.holder);
                }
                Ok(())
            }
            Ok(false) => Err(LockError::NotHeld {
                key: state.key.name.clone(),
            }),
            Err(failure) => Err(failure.error),
        }
    }

    fn describe(&self) -> String {
        format!(
            "the release of lock `{}` (it will expire by its ttl)",
            self.state.key.name
        )
    }
}

/// A nested call asked for `ttl`: lengthen the lease if that outlasts the
/// one it has, never shorten it. Costs a round trip only when it extends.
pub(crate) async fn extend(client: &ClientInner, state: &LeaseState, ttl: Duration) -> Result<(), LockError> {
    let ttl = client.backend.lease_for(ttl);
    if state.covers(ttl) {
        return Ok(());
    }
    let sent = Instant::now();
    let renewed = client.backend.renew(&state.key, &state.holder, ttl, true).await?;
    if !renewed {
        return Err(LockError::Lost {
            key: state.key.name.clone(),
            reason: LostReason::TakenOver,
        });
    }
    state.extended(sent, ttl);
    Ok(())
}
