//! The rules of shared locks (read-write locks and permits) for the
//! backends that keep each holder as a row of a members table (MySQL /
//! MariaDB and PostgreSQL): how members are named, how a lock's gate is
//! marked, and who is admitted. Redis applies the same rules in
//! `acquire_shared.lua`.

use std::time::Duration;

use super::Found;

/// Whether `holder` names a member of a shared lock rather than an
/// exclusive holder (whose ids are hex, never `r`, `w` or `p`).
pub(crate) fn is_member(holder: &str) -> bool {
    matches!(holder.as_bytes(), [b'r' | b'w' | b'p', b':', ..])
}

/// What an operator's tool reads of a lock's row (`holder`, the ms left
/// of its lease, -1 for a shared lock's gate and -2 once it ended; its
/// fence counter; the database's clock) and of its members (with the ms
/// their leases end), in the shape the Redis backend reads: a gate is a
/// shared lock whose members hold it (a writer's claim among them); any
/// other live row is held by `holder`, with a fair lock's unlapsed places
/// as its line, and `marked` when a waiter asked for its release to be
/// announced (PostgreSQL's `waiting`; shown as Redis shows it, `+w` after
/// the holder). `None`: the lock is free.
pub(crate) fn found_in_table(
    holder: String,
    left_ms: i64,
    fence: Option<u64>,
    now_ms: i64,
    members: Vec<(String, i64)>,
    marked: bool,
) -> Option<Found> {
    if holder.starts_with('#') {
        return Some(Found {
            redis_type: "zset".into(),
            now_ms,
            pttl_ms: -1,
            fence,
            in_line: 0,
            value: None,
            members,
        });
    }
    if holder.is_empty() || left_ms < 0 {
        return None;
    }
    let in_line = members.iter().filter(|(_, ends)| *ends > now_ms).count();
    Some(Found {
        redis_type: "string".into(),
        now_ms,
        pttl_ms: left_ms,
        fence,
        in_line: u64::try_from(in_line).unwrap_or(u64::MAX),
        value: Some(if marked { format!("{holder}+w") } else { holder }),
        members: Vec::new(),
    })
}

/// The gate marker for the shared lock `member` belongs to.
pub(crate) fn marker(member: &str) -> &'static str {
    if member.starts_with("p:") {
        "#permits"
    } else {
        "#rw"
    }
}

/// The kind a gate marker stands for, as conflicts name it.
pub(crate) fn gate_kind(holder: &str) -> &'static str {
    if holder == "#permits" {
        "semaphore"
    } else {
        "read-write lock"
    }
}

/// What admission decided, from the members found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Already a member: an earlier attempt's reply was lost.
    Again,
    Admitted,
    /// Refused; this much is left of the first lease in the way.
    Refused(Duration),
}

/// A reader yields to a writer and to a writer's claim; a writer to every
/// holder but not to another writer's claim; a permit is one of at most
/// `permits`. `members` are the live ones with what is left of their
/// leases, soonest end first.
pub(crate) fn admit(member: &str, permits: u32, members: &[(String, Duration)]) -> Admission {
    if members.iter().any(|(m, _)| m == member) {
        return Admission::Again;
    }
    if permits > 0 {
        let full = members.len() >= usize::try_from(permits).unwrap_or(usize::MAX);
        return match members.first() {
            Some((_, left)) if full => Admission::Refused(*left),
            _ => Admission::Admitted,
        };
    }
    let reader = member.starts_with("r:");
    let in_the_way = members.iter().find(|(other, _)| {
        if reader {
            !other.starts_with("r:")
        } else {
            !other.starts_with("q:")
        }
    });
    match in_the_way {
        Some((_, left)) => Admission::Refused(*left),
        None => Admission::Admitted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(members: &[&str]) -> Vec<(String, Duration)> {
        members
            .iter()
            .map(|m| ((*m).to_owned(), Duration::from_secs(1)))
            .collect()
    }

    #[test]
    fn readers_share_and_yield_to_writers_and_claims() {
        assert_eq!(admit("r:a:1", 0, &live(&["r:b:1"])), Admission::Admitted);
        assert!(matches!(
            admit("r:a:1", 0, &live(&["w:b:1"])),
            Admission::Refused(_)
        ));
        assert!(matches!(
            admit("r:a:1", 0, &live(&["q:b:1"])),
            Admission::Refused(_)
        ));
    }

    #[test]
    fn a_writer_yields_to_holders_but_not_to_claims() {
        assert!(matches!(
            admit("w:a:1", 0, &live(&["r:b:1"])),
            Admission::Refused(_)
        ));
        assert_eq!(admit("w:a:1", 0, &live(&["q:b:1", "q:a:1"])), Admission::Admitted);
        assert_eq!(admit("w:a:1", 0, &live(&["w:a:1"])), Admission::Again);
    }

    #[test]
    fn permits_count_holders() {
        assert_eq!(admit("p:a:1", 2, &live(&["p:b:1"])), Admission::Admitted);
        assert!(matches!(
            admit("p:a:1", 2, &live(&["p:b:1", "p:c:1"])),
            Admission::Refused(_)
        ));
    }

    #[test]
    fn members_are_told_from_exclusive_holders() {
        assert!(is_member("r:ab:1") && is_member("w:ab:1") && is_member("p:ab:1"));
        assert!(!is_member("ab12:3") && !is_member("q:ab:1"));
    }
}
