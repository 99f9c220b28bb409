//! Redlock: one lock over N independent Redis masters, held while a majority
//! of them hold it.
//!
//! Each master is a [`RedisBackend`] with its own connection and the same
//! scripts; this layer asks all of them at once, each bounded by a per-node
//! timeout that is small against the ttl, and counts. The validity deadline
//! is measured by the caller from *before* the first request, so the time
//! spent collecting a majority is already taken out of the lease.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;

use super::RedisBackend;
use crate::backend::contract::{
    AcquireReply, AcquireRequest, Backend, Failure, HandOver, OwnedAcquireRequest, RenewItem, Renewal,
};
use crate::error::LockError;
use crate::key::LockKey;
use crate::spec::Kind;

/// Why a Redlock cannot take a lock of `kind`, if it cannot.
///
/// A read-write lock stays sound: any two majorities share a master, whose
/// script refuses a reader beside a writer (or two writers), exactly as for
/// the exclusive lock. Permits do not: with 3 masters and 2 permits, holders
/// A on {1,2} and B on {2,3} fill master 2, yet C still finds a free permit
/// on 1 and on 3, a majority, and becomes a third holder. Segments do not
/// either: each master picks its own first free segment, so the answers need
/// not agree on one.
pub(crate) fn unsupported(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::Exclusive | Kind::Read | Kind::Write => None,
        Kind::Permits(_) => Some(
            "`permits` (majorities of masters with free permits need not overlap in a full one, so a Redlock could admit more than N holders)",
        ),
        Kind::Segments(_) => Some("`segments` (each master would pick its own free segment)"),
        Kind::Fair => Some(
            "`fair` (a line of waiters kept on every master could come out in a different order on each)",
        ),
    }
}

#[derive(Debug)]
pub(crate) struct RedlockBackend {
    /// Shared with the requests an acquisition leaves running once a
    /// majority has answered.
    nodes: Arc<[RedisBackend]>,
    node_timeout: Duration,
}

/// One master's answer, or why there is none.
enum Answer<T> {
    Got(T),
    Failed(String),
}

impl<T> Answer<T> {
    /// `node`'s answer to `call` within `timeout`, or why there is none, in
    /// the words a `QuorumNotReached` lists its causes in.
    async fn within(
        node: &RedisBackend,
        timeout: Duration,
        call: impl Future<Output = Result<T, Failure>>,
    ) -> Self {
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(value)) => Answer::Got(value),
            Ok(Err(failure)) => Answer::Failed(format!("{}: {}", node.node(), failure.error)),
            Err(_) => Answer::Failed(format!("{}: no reply within {timeout:?}", node.node())),
        }
    }
}

/// Lets the calls still out when a majority decided run to their end in the
/// background (each is bounded by the node timeout). Dropped instead, a
/// call not yet written would never be sent, leaving the lock on a bare
/// majority.
fn run_on<F>(mut pending: FuturesUnordered<F>)
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    if !pending.is_empty() {
        tokio::spawn(async move { while pending.next().await.is_some() {} });
    }
}

impl RedlockBackend {
    pub(crate) fn new(nodes: Vec<RedisBackend>, node_timeout: Duration) -> Self {
        RedlockBackend {
            nodes: nodes.into(),
            node_timeout,
        }
    }

    pub(crate) fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    pub(crate) fn nodes(&self) -> &[RedisBackend] {
        &self.nodes
    }

    /// Runs `op` on every master at once, each bounded by the node timeout.
    async fn ask_all<'a, T, F, Fut>(&'a self, op: F) -> Vec<Answer<T>>
    where
        F: Fn(&'a RedisBackend) -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let timeout = self.node_timeout;
        join_all(
            self.nodes
                .iter()
                .map(|node| Answer::within(node, timeout, op(node))),
        )
        .await
    }

    /// Whether a lock can be handed from its holder to a waiter of this
    /// client: unless the masters' writes must wait for replicas.
    pub(crate) fn hands_over(&self) -> bool {
        self.nodes.iter().all(RedisBackend::hands_over)
    }

    /// Hands the exclusive lock `key` from `from` to `to` (`handoff.rs`) on
    /// every master at once: handed once a majority of them handed it,
    /// exactly as an acquisition is granted once a majority granted it (the
    /// caller counts the lease from before the calls). The masters that
    /// have not answered by then still get their call, as an acquisition's
    /// do, so that the lock reaches every master that answers.
    ///
    /// Without a majority the handoff is undone: `to` is released on every
    /// master (owner-checked, so harmless where it got nothing; on each
    /// master's connection after the handoff, so never overtaken by it), and
    /// the handoff is refused, so that the caller releases `from` as usual
    /// and the waiter, told it was not handed the lock, looks again.
    pub(crate) async fn hand_over(
        &self,
        key: &LockKey,
        from: &str,
        to: &str,
        ttl: Duration,
        fencing: bool,
    ) -> Result<HandOver, Failure> {
        let timeout = self.node_timeout;
        let owned = Arc::new((key.clone(), from.to_owned(), to.to_owned()));
        let mut pending: FuturesUnordered<_> = (0..self.nodes.len())
            .map(|index| {
                let (nodes, owned) = (Arc::clone(&self.nodes), Arc::clone(&owned));
                async move {
                    let (key, from, to) = &*owned;
                    let node = &nodes[index];
                    let call = node.hand_over(key, from, to, ttl, fencing);
                    (index, Answer::within(node, timeout, call).await)
                }
            })
            .collect();
        let mut handed = 0;
        let mut causes = Vec::new();
        while let Some((index, answer)) = pending.next().await {
            match answer {
                Answer::Got(HandOver::Handed { .. }) => handed += 1,
                Answer::Got(HandOver::NotHeld) => {
                    causes.push(format!("{}: not held by the giver", self.nodes[index].node()));
                }
                Answer::Failed(cause) => causes.push(cause),
            }
            if handed >= self.quorum() {
                run_on(pending);
                return Ok(HandOver::Handed { token: None });
            }
            if causes.len() > self.nodes.len() - self.quorum() {
                break;
            }
        }
        drop(pending);
        self.ask_all(|node| node.release(key, to)).await;
        Err(Failure {
            transient: false,
            ..self.quorum_failure(key, handed, causes)
        })
    }

    /// Sets the lock's lease to end `left` from now on every master that
    /// still has it for `holder` (`AnyBackend::keep`). The majority that
    /// granted the lock gave it a lease of at least the hold, so a master
    /// this misses keeps it longer, never shorter.
    pub(crate) async fn keep(&self, key: &LockKey, holder: &str, left: Duration) -> Result<bool, Failure> {
        let answers = self.ask_all(|node| node.keep(key, holder, left)).await;
        self.done_anywhere(key, answers)
    }

    /// Whether any master did what an owner-checked end of a lease asked
    /// (a release, a keep): an error only if no master answered at all.
    fn done_anywhere(&self, key: &LockKey, answers: Vec<Answer<bool>>) -> Result<bool, Failure> {
        let mut done = false;
        let mut causes = Vec::new();
        for answer in answers {
            match answer {
                Answer::Got(d) => done |= d,
                Answer::Failed(cause) => causes.push(cause),
            }
        }
        if !done && causes.len() == self.nodes.len() {
            return Err(self.quorum_failure(key, 0, causes));
        }
        Ok(done)
    }

    fn quorum_failure(&self, key: &LockKey, granted: usize, causes: Vec<String>) -> Failure {
        Failure {
            error: LockError::QuorumNotReached {
                key: key.name.clone(),
                granted,
                needed: self.quorum(),
                causes: causes.join("; "),
            },
            // Nodes come back and holders release: worth retrying in `wait`.
            transient: true,
            reconnecting: false,
        }
    }
}

impl Backend for RedlockBackend {
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireReply, Failure> {
        let timeout = self.node_timeout;
        let owned = Arc::new(OwnedAcquireRequest::new(req));
        let mut pending: FuturesUnordered<_> = (0..self.nodes.len())
            .map(|index| {
                let (nodes, owned) = (Arc::clone(&self.nodes), Arc::clone(&owned));
                async move {
                    let node = &nodes[index];
                    (
                        index,
                        Answer::within(node, timeout, node.acquire(&owned.borrowed())).await,
                    )
                }
            })
            .collect();
        let (mut granted, mut held, mut shortest, mut blocker) = (0, 0, None::<Duration>, 0);
        // Masters that answered "held" granted nothing, but may keep a
        // writer's claim, which must outlive this attempt.
        let mut refused: Vec<&RedisBackend> = Vec::new();
        let mut claimed = false;
        let mut causes = Vec::new();
        // Decided as soon as a majority granted (stragglers cannot change
        // that: a late grant is ours and goes with the release), or as soon
        // as a majority has become impossible.
        while let Some((index, answer)) = pending.next().await {
            let node = &self.nodes[index];
            match answer {
                Answer::Got(AcquireReply::Acquired { .. }) => granted += 1,
                Answer::Got(AcquireReply::Held {
                    pttl,
                    claimed: c,
                    blocked_by,
                }) => {
                    held += 1;
                    claimed |= c;
                    blocker = blocked_by;
                    refused.push(node);
                    if let Some(pttl) = pttl {
                        shortest = Some(shortest.map_or(pttl, |s| s.min(pttl)));
                    }
                    causes.push(format!("{}: held by another holder", node.node()));
                }
                Answer::Failed(cause) => causes.push(cause),
            }
            if granted >= self.quorum() {
                // A grant that lands after the release is this holder's and
                // expires with its lease.
                run_on(pending);
                return Ok(AcquireReply::acquired(None));
            }
            if causes.len() > self.nodes.len() - self.quorum() {
                break;
            }
        }
        drop(pending);
        // No majority: give back what this attempt got on every master that
        // did not refuse it (owner-checked, so harmless where it got
        // nothing), before anyone retries with the same holder id.
        let undo = self
            .nodes
            .iter()
            .filter(|node| !refused.iter().any(|r| std::ptr::eq(*r, *node)))
            .map(|node| async move {
                if req.also.is_empty() {
                    tokio::time::timeout(timeout, node.release(req.key, req.holder))
                        .await
                        .ok();
                } else {
                    let set: Vec<LockKey> = std::iter::once(req.key).chain(req.also).cloned().collect();
                    tokio::time::timeout(timeout, node.release_many(&set, req.holder))
                        .await
                        .ok();
                }
            });
        join_all(undo).await;
        if held >= self.quorum() {
            return Ok(AcquireReply::Held {
                pttl: shortest,
                claimed,
                blocked_by: blocker,
            });
        }
        Err(self.quorum_failure(req.key, granted, causes))
    }

    async fn release(&self, key: &LockKey, holder: &str) -> Result<bool, Failure> {
        let answers = self.ask_all(|node| node.release(key, holder)).await;
        self.done_anywhere(key, answers)
    }

    async fn release_many(&self, keys: &[LockKey], holder: &str) -> Result<bool, Failure> {
        let answers = self.ask_all(|node| node.release_many(keys, holder)).await;
        Ok(answers.iter().any(|a| matches!(a, Answer::Got(true))))
    }

    async fn release_segments(&self, key: &LockKey, count: u32, holder: &str) -> Result<bool, Failure> {
        let answers = self
            .ask_all(|node| node.release_segments(key, count, holder))
            .await;
        Ok(answers.iter().any(|a| matches!(a, Answer::Got(true))))
    }

    async fn renew(&self, key: &LockKey, holder: &str, ttl: Duration) -> Result<bool, Failure> {
        let answers = self.ask_all(|node| node.renew(key, holder, ttl)).await;
        let outcome = tally(
            answers.into_iter().map(|a| match a {
                Answer::Got(r) => Answer::Got(Renewal::from(r)),
                Answer::Failed(c) => Answer::Failed(c),
            }),
            self.nodes.len(),
            self.quorum(),
        );
        match outcome {
            (Renewal::Renewed, _) => Ok(true),
            (Renewal::Gone, _) => Ok(false),
            (Renewal::Unconfirmed, causes) => Err(self.quorum_failure(key, 0, causes)),
        }
    }

    async fn renew_many(&self, items: &[RenewItem<'_>]) -> Result<Vec<Renewal>, Failure> {
        let per_node = self.ask_all(|node| node.renew_many(items)).await;
        let outcomes = (0..items.len())
            .map(|i| {
                let answers = per_node.iter().map(|answer| match answer {
                    Answer::Got(renewals) => renewals.get(i).map_or_else(
                        || Answer::Failed("short renewal reply".to_owned()),
                        |&r| Answer::Got(r),
                    ),
                    Answer::Failed(cause) => Answer::Failed(cause.clone()),
                });
                tally(answers, self.nodes.len(), self.quorum()).0
            })
            .collect();
        Ok(outcomes)
    }
}

/// A Redlock renewal holds when a majority renewed, is lost when a majority
/// can no longer renew, and is unconfirmed otherwise.
fn tally(
    answers: impl Iterator<Item = Answer<Renewal>>,
    nodes: usize,
    quorum: usize,
) -> (Renewal, Vec<String>) {
    let (mut renewed, mut gone) = (0, 0);
    let mut causes = Vec::new();
    for answer in answers {
        match answer {
            Answer::Got(Renewal::Renewed) => renewed += 1,
            Answer::Got(Renewal::Gone) => gone += 1,
            Answer::Got(Renewal::Unconfirmed) => {}
            Answer::Failed(cause) => causes.push(cause),
        }
    }
    let outcome = if renewed >= quorum {
        Renewal::Renewed
    } else if gone > nodes - quorum {
        Renewal::Gone
    } else {
        Renewal::Unconfirmed
    };
    (outcome, causes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers(list: &[Option<Renewal>]) -> impl Iterator<Item = Answer<Renewal>> + '_ {
        list.iter().map(|a| match a {
            Some(r) => Answer::Got(*r),
            None => Answer::Failed("down".into()),
        })
    }

    #[test]
    fn a_majority_decides_and_silence_is_not_a_verdict() {
        use Renewal::*;
        let of3 = |list: &[Option<Renewal>]| tally(answers(list), 3, 2).0;
        assert_eq!(of3(&[Some(Renewed), Some(Renewed), None]), Renewed);
        assert_eq!(of3(&[Some(Renewed), None, None]), Unconfirmed);
        assert_eq!(of3(&[Some(Renewed), Some(Gone), None]), Unconfirmed);
        assert_eq!(of3(&[Some(Gone), Some(Gone), None]), Gone);
        assert_eq!(of3(&[Some(Gone), Some(Renewed), Some(Renewed)]), Renewed);
        let of5 = |list: &[Option<Renewal>]| tally(answers(list), 5, 3).0;
        assert_eq!(
            of5(&[Some(Gone), Some(Gone), None, None, Some(Renewed)]),
            Unconfirmed
        );
        assert_eq!(of5(&[Some(Gone), Some(Gone), Some(Gone), None, None]), Gone);
    }
}
