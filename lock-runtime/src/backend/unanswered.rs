//! Acquisition attempts on a pool of connections whose caller stopped
//! waiting for the answer (the call was cancelled, or ran out of time).
//!
//! The statement may still be applied, later. The drop's give-back goes
//! out on another pooled connection, so it could land first, find nothing,
//! and leave the late grant standing for its whole lease (the CI tier met
//! that on PostgreSQL: a lock held 30 s after its acquisition was
//! aborted). So the attempt's connection is settled first (PostgreSQL: a
//! no-op sent behind the attempt is answered, a connection answering in
//! order; MariaDB: the connection's server thread is killed and gone), and
//! a give-back for the same holder waits for that ([`Unanswered::settled`]).
//! Redis needs none of this: an attempt and its give-back share the
//! acquisitions' connection, which carries the give-back behind the
//! attempt (only renewals use the other one).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

/// A pooled connection whose unanswered statements can be waited out.
pub(crate) trait Answering: Send + 'static {
    /// What settling needs besides the connection (MariaDB: the pool, for
    /// another connection).
    type Context: Clone + Send + 'static;

    /// Returns once nothing sent on this connection can still be applied.
    fn answer_pending(self, context: Self::Context) -> impl Future<Output = ()> + Send;
}

/// Counts, by holder, the attempts dropped unanswered whose connection has
/// not answered since.
#[derive(Debug, Default)]
pub(crate) struct Unanswered(Mutex<HashMap<String, watch::Sender<usize>>>);

impl Unanswered {
    fn table(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<usize>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add(&self, holder: &str) {
        self.table()
            .entry(holder.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .send_modify(|n| *n += 1);
    }

    fn answered(&self, holder: &str) {
        let mut table = self.table();
        if let Some(count) = table.get(holder) {
            count.send_modify(|n| *n = n.saturating_sub(1));
            if *count.borrow() == 0 {
                // Watchers see the 0 before the channel closes.
                table.remove(holder);
            }
        }
    }

    /// Waits, at most `bound`, until every attempt of `holder` dropped
    /// unanswered has been answered, so that a give-back sent next lands
    /// after it. At once when there is none.
    pub(crate) async fn settled(&self, holder: &str, bound: Duration) {
        let pending = self.table().get(holder).map(watch::Sender::subscribe);
        if let Some(mut pending) = pending {
            let _ = tokio::time::timeout(bound, pending.wait_for(|n| *n == 0)).await;
        }
    }

    /// `connection`, carrying an attempt of `holder` until
    /// [`Attempt::answered`].
    pub(crate) fn attempt<'a, C: Answering>(
        self: &'a Arc<Self>,
        connection: C,
        context: &'a C::Context,
        holder: &'a str,
    ) -> Attempt<'a, C> {
        Attempt {
            connection: Some(connection),
            context,
            holder,
            unanswered: self,
        }
    }
}

/// An acquisition attempt's connection while the attempt runs.
pub(crate) struct Attempt<'a, C: Answering> {
    /// Taken when the attempt is answered; still here when it is dropped
    /// before that.
    connection: Option<C>,
    context: &'a C::Context,
    holder: &'a str,
    unanswered: &'a Arc<Unanswered>,
}

impl<C: Answering> Attempt<'_, C> {
    /// The connection, while the attempt runs.
    pub(crate) fn connection(&mut self) -> &mut C {
        self.connection.as_mut().expect("held until answered")
    }

    /// The attempt's statements were answered: the connection goes back
    /// to its pool as usual. (An attempt that failed with an error skips
    /// this and is settled as a dropped one: rare, and one step more.)
    pub(crate) fn answered(mut self) {
        self.connection = None;
    }
}

impl<C: Answering> Drop for Attempt<'_, C> {
    fn drop(&mut self) {
        let Some(connection) = self.connection.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to wait on: the give-back goes out unordered, and
            // at worst the lease runs out.
            return;
        };
        let (unanswered, holder) = (Arc::clone(self.unanswered), self.holder.to_owned());
        let context = self.context.clone();
        unanswered.add(&holder);
        runtime.spawn(async move {
            connection.answer_pending(context).await;
            unanswered.answered(&holder);
        });
    }
}
