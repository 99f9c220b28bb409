//! Lock names and the Redis keys derived from them (the README's "Redis data
//! layout").

use crate::error::LockError;

/// The longest key a caller may render. Redis would take 512 MB; a lock name
/// that long is a bug, and it would be copied into every log line.
pub(crate) const MAX_KEY_BYTES: usize = 1024;

/// A validated lock name with the Redis names derived from it.
///
/// The user's key is wrapped in a hash tag so that the lock, its fence
/// counter and its release channel always land in one Cluster slot. That is
/// why braces are refused in user keys: they would move or break the tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockKey {
    /// The key as the caller rendered it: what errors and traces show.
    pub(crate) name: String,
    /// `P{K}`: a string holding the holder id, with a PTTL.
    pub(crate) redis_key: String,
    /// `P{K}:released`: where releases are announced.
    pub(crate) channel: String,
}

impl LockKey {
    /// `P{K}:fence`: the fencing counter, without TTL. Built when needed:
    /// only fenced or contended acquisitions use it.
    pub(crate) fn fence_key(&self) -> String {
        format!("{}:fence", self.redis_key)
    }

    /// `P{K}:line`: a fair lock's waiters, in order.
    pub(crate) fn line_key(&self) -> String {
        format!("{}:line", self.redis_key)
    }

    /// `P{K}:alive`: when each of a fair lock's waiters loses its place.
    pub(crate) fn alive_key(&self) -> String {
        format!("{}:alive", self.redis_key)
    }

    /// The Redis Cluster slot of the lock (of its hash tag, `{K}`).
    pub(crate) fn slot(&self) -> u16 {
        const SLOTS: u16 = 16384;
        let tag = self
            .redis_key
            .split_once('{')
            .and_then(|(_, rest)| rest.split_once('}'))
            .map_or(self.redis_key.as_str(), |(tag, _)| tag);
        crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % SLOTS
    }

    /// Segment `i` of a segmented lock: `P{K}#i`, in the slot of `P{K}`
    /// (so that one script can try every segment), named `K#i` in errors
    /// and traces. All segments announce releases on the lock's channel, so
    /// a waiter hears whichever frees first.
    pub(crate) fn segment(&self, i: u32) -> LockKey {
        LockKey {
            name: format!("{}#{i}", self.name),
            redis_key: format!("{}#{i}", self.redis_key),
            channel: self.channel.clone(),
        }
    }

    /// The segment keys `P{K}#0 … P{K}#(n-1)`.
    pub(crate) fn segment_keys(&self, n: u32) -> impl Iterator<Item = String> + '_ {
        (0..n).map(|i| format!("{}#{i}", self.redis_key))
    }

    /// The lock of the election `name` (`LockClient::election`): `P{K}:leader`,
    /// with its fence counter `P{K}:leader:fence` (the terms' epochs), its
    /// record `P{K}:leader:value` (who leads, and with what value) and its
    /// channel `P{K}:leader:released`. A lock's own keys end in `}` (or in
    /// `}#i`, a segment's), and a lock name cannot hold a brace, so no lock
    /// is ever named like an election's. Shown as `K (election)` in errors
    /// and traces.
    pub(crate) fn election(prefix: &str, name: &str) -> Result<Self, LockError> {
        validate(name)?;
        let redis_key = format!("{prefix}{{{name}}}:leader");
        Ok(LockKey {
            name: format!("{name} (election)"),
            channel: format!("{redis_key}:released"),
            redis_key,
        })
    }

    /// Whether this is an election's term (`P{K}:leader`).
    pub(crate) fn is_election(&self) -> bool {
        self.redis_key.ends_with("}:leader")
    }

    /// An election's record: `P{K}:leader:value`.
    pub(crate) fn record_key(&self) -> String {
        format!("{}:value", self.redis_key)
    }

    pub(crate) fn new(prefix: &str, name: String) -> Result<Self, LockError> {
        validate(&name)?;
        // Built by hand: `format!` costs several times these two copies, on
        // every acquisition.
        const CHANNEL_SUFFIX: &str = ":released";
        let mut redis_key = String::with_capacity(prefix.len() + name.len() + 2);
        redis_key.push_str(prefix);
        redis_key.push('{');
        redis_key.push_str(&name);
        redis_key.push('}');
        let mut channel = String::with_capacity(redis_key.len() + CHANNEL_SUFFIX.len());
        channel.push_str(&redis_key);
        channel.push_str(CHANNEL_SUFFIX);
        Ok(LockKey {
            name,
            redis_key,
            channel,
        })
    }
}

fn validate(name: &str) -> Result<(), LockError> {
    let reject = |reason: String| {
        Err(LockError::InvalidKey {
            key: printable(name),
            reason,
        })
    };
    if name.trim().is_empty() {
        return reject("the key is empty after rendering".into());
    }
    if name.len() > MAX_KEY_BYTES {
        return reject(format!(
            "the key is {} bytes long; the limit is {MAX_KEY_BYTES}",
            name.len()
        ));
    }
    if let Some(c) = name.chars().find(|c| matches!(c, '{' | '}')) {
        return reject(format!(
            "it contains `{c}`; braces are reserved for the Redis Cluster hash tag the library adds"
        ));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return reject(format!(
            "it contains the control character {}; keys are names, so newlines and NULs are refused",
            c.escape_default()
        ));
    }
    Ok(())
}

/// Keys go into error messages and logs: escape what would break a line, and
/// shorten what would flood it.
fn printable(name: &str) -> String {
    const SHOWN: usize = 80;
    let escaped: String = name
        .chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect();
    match escaped.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &escaped[..cut]),
        None => escaped,
    }
}

/// Checks a configured key prefix: it becomes part of every Redis key, so it
/// must not carry its own hash tag or control characters.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), String> {
    if prefix.contains(['{', '}']) {
        return Err(format!(
            "key prefix `{prefix}` contains a brace; the library owns the hash tag"
        ));
    }
    if prefix.chars().any(char::is_control) {
        return Err("key prefix contains a control character".into());
    }
    if prefix.len() > MAX_KEY_BYTES {
        return Err(format!("key prefix is longer than {MAX_KEY_BYTES} bytes"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_names_follow_the_documented_layout() {
        let key = LockKey::new("lock:", "stock:42".to_owned()).expect("valid key");
        assert_eq!(key.redis_key, "lock:{stock:42}");
        assert_eq!(key.channel, "lock:{stock:42}:released");
        assert_eq!(key.fence_key(), "lock:{stock:42}:fence");
        let key = LockKey::new("", "ü".to_owned()).expect("valid key");
        assert_eq!(
            (key.redis_key.as_str(), key.channel.as_str()),
            ("{ü}", "{ü}:released")
        );
    }

    #[test]
    fn slots_agree_with_the_redis_crate() {
        for name in [
            "a",
            "account:1",
            "account:2",
            "stock:42",
            "ü:ñ",
            "x".repeat(300).as_str(),
        ] {
            let key = LockKey::new("lock:", name.to_owned()).expect("valid key");
            let theirs = format!("{:?}", redis::cluster_routing::Slot::for_key(&key.redis_key));
            assert_eq!(theirs, format!("Slot({})", key.slot()), "{name}");
        }
    }

    fn reason(name: &str) -> String {
        match LockKey::new("lock:", name.to_owned()) {
            Err(LockError::InvalidKey { reason, .. }) => reason,
            other => panic!("expected InvalidKey for {name:?}, got {other:?}"),
        }
    }

    #[test]
    fn layout_shares_one_hash_tag() {
        let k = LockKey::new("lock:", "stock:42".into()).expect("valid key");
        assert_eq!(k.redis_key, "lock:{stock:42}");
        assert_eq!(k.fence_key(), "lock:{stock:42}:fence");
        assert_eq!(k.channel, "lock:{stock:42}:released");
    }

    #[test]
    fn bad_keys_say_why() {
        assert!(reason("").contains("empty"));
        assert!(reason("  ").contains("empty"));
        assert!(reason("a{b").contains("`{`"));
        assert!(reason("a}b").contains("`}`"));
        assert!(reason("a\nb").contains("\\n"));
        assert!(reason("a\0b").contains("\\u{0}"));
        assert!(reason(&"x".repeat(1025)).contains("1025 bytes"));
        assert!(LockKey::new("lock:", "x".repeat(1024)).is_ok());
        assert!(LockKey::new("lock:", "ünï:cödé ok".into()).is_ok());
    }

    #[test]
    fn printable_escapes_and_truncates() {
        assert_eq!(printable("a\nb"), "a\\nb");
        let long = printable(&"y".repeat(500));
        assert!(long.ends_with('…') && long.chars().count() == 81);
    }

    /// C1: whatever the caller renders, the lock, its fence counter and its
    /// release channel share one cluster slot, or the key is refused before
    /// any I/O. Random keys over an alphabet chosen to break hash tags.
    #[test]
    fn every_accepted_key_keeps_its_names_in_one_slot() {
        use rand::{Rng, SeedableRng};
        use redis::cluster_routing::Slot;
        const ALPHABET: &[char] = &[
            'a', 'Z', '0', ':', '-', '_', ' ', '{', '}', '{', '}', '\n', '\0', '\t', 'é', '漢', '🔒', '<',
            '>', '.',
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5107);
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..20_000 {
            let len = rng.random_range(0..12);
            let name: String = (0..len)
                .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())])
                .collect();
            for prefix in ["lock:", "", "app:v2:"] {
                match LockKey::new(prefix, name.clone()) {
                    Ok(key) => {
                        accepted += 1;
                        let slot = Slot::for_key(&key.redis_key);
                        assert_eq!(Slot::for_key(key.fence_key()), slot, "{name:?}");
                        assert_eq!(Slot::for_key(&key.channel), slot, "{name:?}");
                        // The tag is exactly the caller's key.
                        assert_eq!(slot, Slot::for_key(format!("{{{name}}}")), "{name:?}");
                    }
                    Err(LockError::InvalidKey { .. }) => refused += 1,
                    Err(other) => panic!("{name:?}: {other}"),
                }
            }
        }
        assert!(
            accepted > 5_000 && refused > 5_000,
            "accepted {accepted}, refused {refused}"
        );
    }

    #[test]
    fn prefixes_without_tags_only() {
        assert!(validate_prefix("lock:").is_ok());
        assert!(validate_prefix("").is_ok());
        assert!(validate_prefix("{x}").is_err());
    }
}
