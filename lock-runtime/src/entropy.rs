//! A client's randomness: the holder ids it gives acquisitions and the
//! jitter of its retries. From the OS by default; from one seed in a
//! simulation (`testing`), so that a seed replays a run exactly.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(any(test, feature = "testing"))]
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rand::Rng;
#[cfg(any(test, feature = "testing"))]
use rand::{SeedableRng, rngs::StdRng};

use crate::spec::Kind;

/// 128 random bits from the OS: the chance that two processes share a prefix
/// is negligible, and sharing one would let them release each other's locks.
/// With the `:` that ends it.
static PROCESS_PREFIX: LazyLock<String> = LazyLock::new(|| format!("{:032x}:", rand::random::<u128>()));
static NEXT_HOLDER: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Default)]
pub(crate) enum Entropy {
    /// The process's prefix and counter, and the thread's RNG.
    #[default]
    Os,
    /// A prefix, a counter and an RNG of this client's own, from a seed.
    #[cfg(any(test, feature = "testing"))]
    Seeded {
        prefix: String,
        next: AtomicU64,
        /// Boxed: a seeded client is for tests, and the RNG's state would
        /// otherwise make every client's `Entropy` that large.
        rng: Box<Mutex<StdRng>>,
    },
}

impl Entropy {
    /// Holder ids and jitter drawn from `seed` alone.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn seeded(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        Entropy::Seeded {
            prefix: format!("{:032x}:", rng.random::<u128>()),
            next: AtomicU64::new(1),
            rng: Box::new(Mutex::new(rng)),
        }
    }

    /// A fresh holder id, `<32 hex digits>:<counter>`; the acquire script
    /// checks this shape to tell our values from foreign ones. A side of a
    /// read-write lock carries its side in front, `r:<id>` or `w:<id>`, and
    /// a permit holder's `p:<id>`, and a fair lock's holder `f:<id>`: the
    /// scripts tell them apart by that prefix.
    pub(crate) fn holder_id(&self, kind: Kind) -> String {
        let (prefix, n) = match self {
            Entropy::Os => (
                PROCESS_PREFIX.as_str(),
                NEXT_HOLDER.fetch_add(1, Ordering::Relaxed),
            ),
            #[cfg(any(test, feature = "testing"))]
            Entropy::Seeded { prefix, next, .. } => (prefix.as_str(), next.fetch_add(1, Ordering::Relaxed)),
        };
        let side = match kind {
            Kind::Read => "r:",
            Kind::Write => "w:",
            Kind::Permits(_) => "p:",
            Kind::Fair => "f:",
            Kind::Exclusive | Kind::Segments(_) => "",
        };
        // Built by hand: `format!` costs several times these copies, on
        // every acquisition.
        let mut id = String::with_capacity(side.len() + prefix.len() + 20);
        id.push_str(side);
        id.push_str(prefix);
        id.push_str(itoa::Buffer::new().format(n));
        id
    }

    /// A random pause in `[d/2, d]`, so waiters released together do not
    /// retry in lockstep.
    pub(crate) fn jitter(&self, d: Duration) -> Duration {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        if nanos < 2 {
            return d;
        }
        let range = nanos / 2..=nanos;
        Duration::from_nanos(match self {
            Entropy::Os => rand::rng().random_range(range),
            #[cfg(any(test, feature = "testing"))]
            Entropy::Seeded { rng, .. } => rng
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .random_range(range),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_ids_are_unique_and_well_formed() {
        for entropy in [Entropy::Os, Entropy::seeded(7)] {
            let a = entropy.holder_id(Kind::Exclusive);
            let b = entropy.holder_id(Kind::Exclusive);
            assert!(entropy.holder_id(Kind::Write).starts_with("w:"));
            assert_ne!(a, b);
            let (prefix, counter) = a.split_once(':').expect("prefix:counter");
            assert_eq!(prefix.len(), 32);
            assert!(prefix.chars().all(|c| c.is_ascii_hexdigit()));
            assert_eq!(
                counter.parse::<u64>().map(|n| n.to_string()).as_deref(),
                Ok(counter)
            );
        }
    }

    #[test]
    fn a_seed_gives_the_same_ids_and_pauses_again() {
        let draw = |entropy: Entropy| {
            let ids: Vec<String> = (0..3).map(|_| entropy.holder_id(Kind::Exclusive)).collect();
            let pauses: Vec<Duration> = (0..3)
                .map(|_| entropy.jitter(Duration::from_millis(100)))
                .collect();
            (ids, pauses)
        };
        assert_eq!(draw(Entropy::seeded(42)), draw(Entropy::seeded(42)));
        assert_ne!(draw(Entropy::seeded(42)).0, draw(Entropy::seeded(43)).0);
        let (_, pauses) = draw(Entropy::seeded(42));
        assert!(
            pauses
                .iter()
                .all(|p| *p >= Duration::from_millis(50) && *p <= Duration::from_millis(100))
        );
    }
}
