//! `Tick`: the scheduled instant of a job, named in its lock key
//! (`key = "report:<tick>"`), so that replicas whose clocks or schedulers
//! differ a little still name the same run of the job the same way.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One scheduled run of a job: an instant on the wall clock, rounded so
/// that every replica names it alike. Put it in the key (`"report:<tick>"`)
/// and each tick is a lock of its own, taken once across replicas.
///
/// It displays in UTC, RFC 3339 (`2026-11-27T22:00:00Z`; with the fraction
/// of a second when it has one: `2026-11-27T22:00:00.500Z`).
///
/// Instants before 1970 (a wall clock set far back) count as 1970-01-01.
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
        let t = nanos(at.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO));
        let period = nanos(period);
        if period == 0 {
            return Tick::from_nanos(t);
        }
        let phase = nanos(phase) % period;
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
        Tick {
            since_epoch: scheduled.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO),
        }
    }

    /// The tick as a wall-clock instant.
    pub fn instant(&self) -> SystemTime {
        UNIX_EPOCH + self.since_epoch
    }

    fn from_nanos(nanos: u128) -> Tick {
        let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
        let sub = u32::try_from(nanos % 1_000_000_000).unwrap_or(0);
        Tick {
            since_epoch: Duration::new(secs, sub),
        }
    }
}

fn nanos(d: Duration) -> u128 {
    d.as_nanos()
}

impl fmt::Display for Tick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let instant = self.instant();
        // `humantime` formats years up to 9999 only; a tick past that (a
        // wall clock set absurdly far ahead) shows its seconds since the
        // epoch instead of failing.
        if self.since_epoch.as_secs() >= LAST_FORMATTED_SECOND {
            return write!(f, "@{}", self.since_epoch.as_secs());
        }
        match self.since_epoch.subsec_nanos() {
            0 => write!(f, "{}", humantime::format_rfc3339_seconds(instant)),
            n if n % 1_000_000 == 0 => write!(f, "{}", humantime::format_rfc3339_millis(instant)),
            n if n % 1_000 == 0 => write!(f, "{}", humantime::format_rfc3339_micros(instant)),
            _ => write!(f, "{}", humantime::format_rfc3339_nanos(instant)),
        }
    }
}

/// 10000-01-01T00:00:00Z in seconds since the epoch.
const LAST_FORMATTED_SECOND: u64 = 253_402_300_800;

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
        assert!(Tick::now(Duration::ZERO) >= Tick::at(before_1970));
        assert_eq!(Tick::at(before_1970).to_string(), "1970-01-01T00:00:00Z");
        let far = UNIX_EPOCH + Duration::from_secs(LAST_FORMATTED_SECOND + 5);
        assert_eq!(
            Tick::at(far).to_string(),
            format!("@{}", LAST_FORMATTED_SECOND + 5)
        );
        assert_eq!(Tick::at(at).instant(), at);
    }
}
