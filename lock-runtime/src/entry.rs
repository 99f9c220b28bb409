//! The one way into a lock, for the attribute, `LockRequest::run` and
//! `LockRequest::acquire` alike: resolve the call's options, check them and
//! the key before any I/O, then re-enter a lock the running code is nested
//! inside, or acquire it.

use std::sync::Arc;

use crate::acquire;
use crate::error::LockError;
use crate::holder;
use crate::key::LockKey;
use crate::lease::{self, Lease};
use crate::lease_state::LeaseState;
use crate::shared::ClientInner;
use crate::spec::{Kind, LockSpec};

/// How a call got its lock.
pub(crate) enum Entered {
    /// The running code is nested inside a body that holds this lock: it is
    /// the same holder, and the enclosing call owns the release.
    Reentered(Arc<LeaseState>),
    /// A new acquisition, released when this lease is.
    Acquired(Lease),
}

pub(crate) async fn enter(
    client: &Arc<ClientInner>,
    name: String,
    spec: &LockSpec,
) -> Result<Entered, LockError> {
    let key = LockKey::new(&client.config.prefix, name)?;
    let opts = spec.resolve(&client.config, &key)?;
    if let Some(held) = holder::find(client, &key) {
        may_reenter(held.kind, opts.kind, &key)?;
        // Only a longer lease costs a round trip; a shorter one never
        // shortens the lease the enclosing call holds.
        lease::extend(client, &held, opts.ttl).await?;
        return Ok(Entered::Reentered(held));
    }
    acquire::acquire(client, key, &opts).await.map(Entered::Acquired)
}

/// Whether a call asking for `asked` may re-enter a lease of `held` on the
/// same key. A writer may read; a reader may not write: waiting for the
/// write lock would wait for its own read lock, forever.
fn may_reenter(held: Kind, asked: Kind, key: &LockKey) -> Result<(), LockError> {
    match (held, asked) {
        (Kind::Exclusive, Kind::Exclusive)
        | (Kind::Write, Kind::Read | Kind::Write)
        | (Kind::Read, Kind::Read)
        | (Kind::Permits(_), Kind::Permits(_))
        | (Kind::Segments(_), Kind::Segments(_)) => Ok(()),
        (Kind::Read, Kind::Write) => Err(LockError::UpgradeRefused {
            key: key.name.clone(),
        }),
        (held, asked) => Err(LockError::InvalidRequest {
            key: key.name.clone(),
            reason: format!(
                "the call is nested inside a {} of this key and asks for a {}; one key is one kind of lock",
                held.describe(),
                asked.describe()
            ),
        }),
    }
}
