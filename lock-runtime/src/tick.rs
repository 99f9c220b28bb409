//! `Tick`: the scheduled instant of a job, named in its lock key
//! (`key = "report:<tick>"`), so that replicas whose clocks or schedulers
//! differ a little still name the same run of the job the same way.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One scheduled run of a job: an instant on the wall clock, rounded so
/// that every replica names it alike. Put it in the key (`"report:<tick>"`)
/// and each run is a lock of its own: with `on_busy = "skip"`, a replica
/// that finds another one running it skips it, and with `hold_at_least`,
/// one that fires after a fast run ended finds it held still.
///
/// Replicas agree when each fires within half a period of the same tick.
/// A job scheduled near the middle between two multiples of its period
/// (daily at 12:00 UTC, hourly at :30) must give its offset as the phase
/// ([`nearest_with_phase`](Self::nearest_with_phase)), or use
/// [`at`](Self::at) with the instant its scheduler planned.
///
/// It displays in UTC, RFC 3339 (`2026-11-27T22:00:00Z`; with the fraction
/// of a second when it has one: `2026-11-27T22:00:00.500Z`).
///
/// A wall clock set before 1970 reads as 1970-01-01T00:00:00Z before
/// rounding; ticks past the year 9999 are 9999-12-31T23:59:59.999999999Z.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tick {
    since_epoch: Duration,
}

impl Tick {
    /// The multiple of `period` since the Unix epoch nearest to `at`: a
    /// replica that fires up to half a period early or late names the same
    /// tick. Halfway between two (exactly), the later one. A zero `period`
    /// does not round: the same as [`Tick::at`].
    pub fn nearest(at: SystemTime, period: Duration) -> Tick {
        Tick::nearest_with_phase(at, period, Duration::ZERO)
    }

    /// As [`nearest`](Self::nearest), for a job scheduled `phase` after
    /// each multiple of `period`: an hourly job at :30 is `period` 1 h,
    /// `phase` 30 min (rounded to the nearest whole hour, it would sit
    /// exactly halfway between two). A `phase` of a period or more counts
    /// modulo the period.
    pub fn nearest_with_phase(at: SystemTime, period: Duration, phase: Duration) -> Tick {
        let t = since_epoch(at).as_nanos();
        let period = period.as_nanos();
        if period == 0 {
            return Tick::from_nanos(t);
        }
        let phase = phase.as_nanos() % period;
        // Counted from the first tick at or after the epoch, the phase;
        // Euclidean division, so that an instant before the first one
        // rounds like any other.
        let offset = i128::try_from(t).unwrap_or(i128::MAX) - i128::try_from(phase).unwrap_or(0);
        let period_i = i128::try_from(period).unwrap_or(i128::MAX);
        let n = (offset + period_i / 2).div_euclid(period_i);
        let tick = n * period_i + i128::try_from(phase).unwrap_or(0);
        Tick::from_nanos(u128::try_from(tick).unwrap_or(0))
    }

    /// The tick nearest to now by this machine's wall clock
    /// ([`nearest`](Self::nearest) of `SystemTime::now()`).
    pub fn now(period: Duration) -> Tick {
        Tick::nearest(SystemTime::now(), period)
    }

    /// The instant itself, not rounded: for a scheduler that gives the
    /// exact instant it scheduled (not the moment it fired).
    pub fn at(scheduled: SystemTime) -> Tick {
        Tick::from_nanos(since_epoch(scheduled).as_nanos())
    }

    /// The tick as a wall-clock instant.
    pub fn instant(&self) -> SystemTime {
        UNIX_EPOCH + self.since_epoch
    }

    /// Kept within what every platform's `SystemTime` and the display can
    /// hold, so that neither [`instant`](Self::instant) nor `Display` can
    /// fail, whatever the clock said.
    fn from_nanos(nanos: u128) -> Tick {
        let nanos = nanos.min(LAST_TICK.as_nanos());
        let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(LAST_TICK.as_secs());
        let sub = u32::try_from(nanos % 1_000_000_000).unwrap_or(0);
        Tick {
            since_epoch: Duration::new(secs, sub),
        }
    }
}

/// 9999-12-31T23:59:59.999999999Z, the last instant RFC 3339 can write.
const LAST_TICK: Duration = Duration::new(253_402_300_799, 999_999_999);

fn since_epoch(at: SystemTime) -> Duration {
    at.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO)
}

impl fmt::Display for Tick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Within `humantime`'s years (to 9999): see `from_nanos`.
        let instant = self.instant();
        match self.since_epoch.subsec_nanos() {
            0 => write!(f, "{}", humantime::format_rfc3339_seconds(instant)),
            n if n % 1_000_000 == 0 => write!(f, "{}", humantime::format_rfc3339_millis(instant)),
            n if n % 1_000 == 0 => write!(f, "{}", humantime::format_rfc3339_micros(instant)),
            _ => write!(f, "{}", humantime::format_rfc3339_nanos(instant)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> SystemTime {
        humantime::parse_rfc3339(text).expect("an RFC 3339 instant")
    }

    #[test]
    fn replicas_a_little_apart_name_the_same_tick() {
        let hour = Duration::from_secs(3600);
        for at in [
            "2026-11-27T21:59:59.700Z",
            "2026-11-27T22:00:00Z",
            "2026-11-27T22:29:59.999Z",
        ] {
            assert_eq!(
                Tick::nearest(utc(at), hour).to_string(),
                "2026-11-27T22:00:00Z",
                "{at}"
            );
        }
        assert_eq!(
            Tick::nearest(utc("2026-11-27T22:30:00Z"), hour).to_string(),
            "2026-11-27T23:00:00Z",
            "halfway goes to the later tick"
        );
        let second = Duration::from_secs(1);
        assert_eq!(
            Tick::nearest(utc("2026-11-27T22:00:04.700Z"), second).to_string(),
            "2026-11-27T22:00:05Z"
        );
        assert_eq!(
            Tick::nearest(utc("2026-11-27T22:00:04.300Z"), second),
            Tick::nearest(utc("2026-11-27T22:00:03.800Z"), second),
        );
    }

    #[test]
    fn a_phase_moves_the_ticks() {
        let (hour, half) = (Duration::from_secs(3600), Duration::from_secs(1800));
        for at in [
            "2026-11-27T22:29:59.500Z",
            "2026-11-27T22:30:00.300Z",
            "2026-11-27T22:05:00Z",
        ] {
            assert_eq!(
                Tick::nearest_with_phase(utc(at), hour, half).to_string(),
                "2026-11-27T22:30:00Z",
                "{at}"
            );
        }
        assert_eq!(
            Tick::nearest_with_phase(utc("2026-11-27T22:30:00Z"), hour, hour + half),
            Tick::nearest_with_phase(utc("2026-11-27T22:30:00Z"), hour, half),
            "a phase counts modulo the period"
        );
    }

    #[test]
    fn fractions_and_odd_inputs_display_without_failing() {
        let at = utc("2026-11-27T22:00:00.250Z");
        assert_eq!(Tick::at(at).to_string(), "2026-11-27T22:00:00.250Z");
        assert_eq!(Tick::nearest(at, Duration::ZERO), Tick::at(at));
        assert_eq!(
            Tick::nearest(at, Duration::from_millis(500)).to_string(),
            "2026-11-27T22:00:00.500Z"
        );
        let before_1970 = UNIX_EPOCH - Duration::from_secs(10);
        assert_eq!(Tick::at(before_1970).to_string(), "1970-01-01T00:00:00Z");
        let (hour, half) = (Duration::from_secs(3600), Duration::from_secs(1800));
        assert_eq!(
            Tick::nearest_with_phase(before_1970, hour, half).to_string(),
            "1970-01-01T00:30:00Z",
            "read as 1970-01-01, then rounded to the first tick of the phase"
        );
        // An instant earlier than the phase rounds like any other.
        let early = UNIX_EPOCH + Duration::from_secs(600);
        assert_eq!(
            Tick::nearest_with_phase(early, hour, half).to_string(),
            "1970-01-01T00:30:00Z"
        );
        // The largest instant a clock can give rounds and displays.
        let far = UNIX_EPOCH + Duration::from_secs(i64::MAX.unsigned_abs());
        for tick in [Tick::at(far), Tick::nearest(far, hour)] {
            assert_eq!(tick.to_string(), "9999-12-31T23:59:59.999999999Z");
            assert_eq!(tick.instant(), UNIX_EPOCH + LAST_TICK);
        }
        assert_eq!(Tick::at(at).instant(), at);
    }
}
