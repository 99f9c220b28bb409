//! Lease arithmetic on the monotonic clock, and the limits every lock call
//! shares, whether it comes from the attribute or the programmatic API.

use std::time::Duration;

use tokio::time::Instant;

/// The shortest lease that leaves time to run a body after the clock-drift
/// allowance and the stop margin (`8ms > 2ms + 5ms`). The attribute refuses
/// a shorter `ttl` at compile time; the programmatic API at the call.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(8);

/// The longest lease: past a day, a renewed lease gains nothing and a fixed
/// one outlives any crash it should cover. The attribute has the same bound.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// A `wait` this long means "wait until the lock is free": longer waits are
/// cut to it, so that no deadline arithmetic can overflow (`Duration::MAX`
/// is a natural way to ask for it).
pub(crate) const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The longest command or per-node timeout and retry pause a client accepts:
/// longer ones are typos, and no network round trip needs an hour.
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// How long a waiting writer's claim holds new readers back unless its next
/// attempt renews it. A waiter attempts at least every 200 ms, so a live
/// writer's claim never lapses; a dead writer holds readers back this long.
pub(crate) const WRITER_CLAIM: Duration = Duration::from_secs(2);

/// Why `ttl` is not a usable lease, if it is not.
pub(crate) fn ttl_problem(ttl: Duration) -> Option<String> {
    if ttl < MIN_TTL {
        return Some(format!(
            "a ttl of {} leaves no time after the {}ms clock-drift allowance and the {}ms stop margin; use at least {}ms",
            shown(ttl),
            millis(drift(ttl)),
            millis(stop_margin(ttl)),
            millis(MIN_TTL)
        ));
    }
    if ttl > MAX_TTL {
        return Some(format!(
            "a ttl of {} is over the 24h limit; leases that long outlive the crashes they should cover",
            shown(ttl)
        ));
    }
    None
}

/// A duration for a message: whole milliseconds, or the sub-millisecond
/// value as Rust writes it.
fn shown(d: Duration) -> String {
    if d < Duration::from_millis(1) || !d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{d:?}")
    } else {
        crate::error::fmt_duration(d)
    }
}

/// The allowance for clock-rate differences between this process and the
/// server: 1% of the lease plus 2 ms for Redis's millisecond expiry precision
/// (the Redlock algorithm's allowance, as its reference clients use it).
pub(crate) fn drift(ttl: Duration) -> Duration {
    Duration::from_millis(millis(ttl) / 100 + 2)
}

/// How long before its deadline a body is stopped: timers fire at or after
/// their instant, never before, and the task may need a moment to be polled.
pub(crate) fn stop_margin(ttl: Duration) -> Duration {
    (ttl / 200).max(Duration::from_millis(5))
}

/// The watchdog renews a lease after a third of it, leaving two more
/// chances before it runs out.
pub(crate) fn renewal_interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// Until when a lock granted with `hold_at_least` of `hold` is kept held,
/// its grant's answer having arrived at `granted` (after the server
/// granted, so a hold counted from here ends no earlier than one counted
/// from the grant): the hold plus the lease's allowance for the server's
/// clock running slower than ours meanwhile (`drift`). A body that ends
/// inside the allowance may end before the hold did on the server's clock.
pub(crate) fn hold_end(granted: Instant, hold: Duration) -> Instant {
    granted + hold + drift(hold)
}

/// Until when a lease of `ttl` whose request was sent at `sent` is trusted.
pub(crate) fn validity_deadline(sent: Instant, ttl: Duration) -> Instant {
    sent + ttl.saturating_sub(drift(ttl))
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `d` in whole milliseconds, rounded up, and at least one: for a time a
/// lock must be held at least, where a rounded-down value would end early.
pub(crate) fn millis_up(d: Duration) -> u64 {
    millis(d + Duration::from_nanos(999_999)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_is_one_percent_plus_two_ms() {
        assert_eq!(drift(Duration::from_secs(30)), Duration::from_millis(302));
        assert_eq!(drift(Duration::from_millis(1)), Duration::from_millis(2));
    }

    #[test]
    fn a_hold_in_milliseconds_is_rounded_up() {
        assert_eq!(millis_up(Duration::ZERO), 1);
        assert_eq!(millis_up(Duration::from_nanos(1)), 1);
        assert_eq!(millis_up(Duration::from_millis(5)), 5);
        assert_eq!(millis_up(Duration::from_micros(5_001)), 6);
    }

    #[test]
    fn deadline_never_precedes_sending() {
        let now = Instant::now();
        assert_eq!(validity_deadline(now, Duration::from_millis(1)), now);
        assert_eq!(
            validity_deadline(now, Duration::from_millis(1000)),
            now + Duration::from_millis(988)
        );
    }

    #[test]
    fn the_limits_are_the_first_and_last_usable_leases() {
        let usable = |ttl: Duration| ttl > drift(ttl) + stop_margin(ttl);
        assert!(usable(MIN_TTL));
        assert!(!usable(Duration::from_millis(7)));
        assert!(ttl_problem(MIN_TTL).is_none() && ttl_problem(MAX_TTL).is_none());
        assert!(ttl_problem(Duration::from_millis(7)).is_some_and(|p| p.contains("at least 8ms")));
        assert!(ttl_problem(Duration::MAX).is_some_and(|p| p.contains("24h")));
        assert!(ttl_problem(Duration::from_nanos(1)).is_some_and(|p| p.contains("1ns")));
        // No deadline arithmetic overflows at the limits.
        let now = Instant::now();
        let _ = validity_deadline(now, MAX_TTL);
        let _ = now + FOREVER;
    }
}
