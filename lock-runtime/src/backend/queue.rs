//! Locks as queues, the shape the ZooKeeper and etcd backends share: each
//! contender joins a lock's line under its holder id (`r:…` a reader, `w:…`
//! a writer, `p:…` a permit holder, anything else exclusive), and what is
//! ahead of it in the line decides whether it holds the lock.

use crate::spec::Kind;

/// What keeps a contender from the lock, judged from the entries ahead of
/// its own (in the order they joined). Each kind treats every other kind's
/// entry as an exclusive holder, so a name used as two kinds stays safe.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum InTheWay<'a> {
    Nothing,
    /// Wait for this entry to go.
    Entry(&'a str),
    /// Too many permit holders ahead: wait for any to go.
    Count,
}

pub(crate) fn in_the_way<'a>(kind: Kind, ahead: &[&'a str]) -> InTheWay<'a> {
    let last_not = |prefix: &str| ahead.iter().rev().find(|n| !n.starts_with(prefix)).copied();
    match kind {
        // Readers share: only a writer (or another kind) ahead blocks.
        Kind::Read => last_not("r:").map_or(InTheWay::Nothing, InTheWay::Entry),
        Kind::Permits(n) => match last_not("p:") {
            Some(other) => InTheWay::Entry(other),
            None if ahead.len() >= usize::try_from(n).unwrap_or(usize::MAX) => InTheWay::Count,
            None => InTheWay::Nothing,
        },
        _ => ahead.last().copied().map_or(InTheWay::Nothing, InTheWay::Entry),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_share_permits_count_and_other_kinds_exclude() {
        let r = |n: &str| format!("r:{n}_0000000001");
        let (r1, r2, w, p1, p2, x) = (
            r("a"),
            r("b"),
            "w:c_2".to_owned(),
            "p:d_3".to_owned(),
            "p:e_4".to_owned(),
            "ab:1_5".to_owned(),
        );
        assert_eq!(in_the_way(Kind::Read, &[&r1, &r2]), InTheWay::Nothing);
        assert_eq!(in_the_way(Kind::Read, &[&r1, &w, &r2]), InTheWay::Entry(&w));
        assert_eq!(in_the_way(Kind::Write, &[&r1, &r2]), InTheWay::Entry(&r2));
        assert_eq!(in_the_way(Kind::Write, &[]), InTheWay::Nothing);
        assert_eq!(in_the_way(Kind::Permits(2), &[&p1]), InTheWay::Nothing);
        assert_eq!(in_the_way(Kind::Permits(2), &[&p1, &p2]), InTheWay::Count);
        assert_eq!(in_the_way(Kind::Permits(3), &[&x, &p1]), InTheWay::Entry(&x));
        assert_eq!(in_the_way(Kind::Read, &[&x]), InTheWay::Entry(&x));
        assert_eq!(in_the_way(Kind::Exclusive, &[&r1]), InTheWay::Entry(&r1));
    }
}
