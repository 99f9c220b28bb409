//! Redis's glob (`*`, `?`, `[…]` with `^` and ranges, `\` escapes), which
//! `lockctl list` takes on every backend, for the backends that keep their
//! lock names in a store with no glob of its own (etcd ranges by prefix
//! only; ZooKeeper lists a node's children whole; MySQL 8 and MariaDB
//! read regular expressions differently; PostgreSQL turns the pattern into
//! a regular expression, and shares only the error here).
//!
//! Written here rather than taken from a crate: the glob crates follow
//! shell or gitignore rules (`/` is special, `[!…]` negates, `**` recurses),
//! and a pattern must select the same locks on every backend as Redis's
//! `SCAN MATCH` does.

use crate::error::LockError;

/// One element of a pattern.
#[cfg(any(feature = "etcd", feature = "mysql", feature = "zookeeper"))]
#[derive(Debug, PartialEq, Eq)]
enum Token {
    /// `*`: any run of characters, empty too.
    Any,
    /// `?`: any one character.
    One,
    Literal(char),
    /// `[…]`: one character in (or, `negated`, not in) the ranges.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// A parsed pattern.
#[cfg(any(feature = "etcd", feature = "mysql", feature = "zookeeper"))]
#[derive(Debug)]
pub(crate) struct Glob(Vec<Token>);

/// The error for a pattern with a `[` that is never closed (or a trailing
/// `\`): refused rather than guessed at.
pub(crate) fn unclosed(pattern: &str) -> LockError {
    LockError::InvalidRequest {
        key: pattern.to_owned(),
        reason: "the pattern has a `[` without its `]`".into(),
    }
}

#[cfg(any(feature = "etcd", feature = "mysql", feature = "zookeeper"))]
impl Glob {
    /// Parses `pattern`; `None` for an unclosed `[` or a trailing `\`.
    pub(crate) fn parse(pattern: &str) -> Option<Glob> {
        let mut tokens = Vec::new();
        let mut chars = pattern.chars();
        while let Some(c) = chars.next() {
            tokens.push(match c {
                '*' => Token::Any,
                '?' => Token::One,
                '\\' => Token::Literal(chars.next()?),
                '[' => {
                    let mut negated = false;
                    let mut ranges: Vec<(char, char)> = Vec::new();
                    let mut first = true;
                    let mut range_from: Option<char> = None;
                    loop {
                        let c = match chars.next()? {
                            ']' if !first => break,
                            '^' if first && !negated => {
                                negated = true;
                                continue;
                            }
                            '-' if !first && range_from.is_none() && !ranges.is_empty() => {
                                range_from = ranges.pop().map(|(from, _)| from);
                                continue;
                            }
                            '\\' => chars.next()?,
                            c => c,
                        };
                        first = false;
                        match range_from.take() {
                            Some(from) => ranges.push((from.min(c), from.max(c))),
                            None => ranges.push((c, c)),
                        }
                    }
                    // A `-` left open before the `]` is a literal `-`.
                    if let Some(from) = range_from {
                        ranges.push((from, from));
                        ranges.push(('-', '-'));
                    }
                    Token::Class { negated, ranges }
                }
                c => Token::Literal(c),
            });
        }
        Some(Glob(tokens))
    }

    /// Whether `text` matches the whole pattern.
    ///
    /// Every token but `*` takes exactly one character, so the classic
    /// scan with one point to return to (the last `*`) decides it in
    /// linear space, without recursion.
    pub(crate) fn matches(&self, text: &str) -> bool {
        let text: Vec<char> = text.chars().collect();
        let (mut p, mut t) = (0, 0);
        let mut back: Option<(usize, usize)> = None;
        while t < text.len() {
            match self.0.get(p) {
                Some(Token::Any) => {
                    back = Some((p, t));
                    p += 1;
                    continue;
                }
                Some(token) if token.takes(text[t]) => {
                    p += 1;
                    t += 1;
                    continue;
                }
                _ => {}
            }
            // A mismatch: let the last `*` take one more character.
            let Some((star, from)) = back else {
                return false;
            };
            back = Some((star, from + 1));
            p = star + 1;
            t = from + 1;
        }
        self.0[p..].iter().all(|token| *token == Token::Any)
    }
}

#[cfg(any(feature = "etcd", feature = "mysql", feature = "zookeeper"))]
impl Token {
    fn takes(&self, c: char) -> bool {
        match self {
            Token::Any | Token::One => true,
            Token::Literal(l) => *l == c,
            Token::Class { negated, ranges } => {
                ranges.iter().any(|(a, b)| (*a..=*b).contains(&c)) != *negated
            }
        }
    }
}

#[cfg(all(test, any(feature = "etcd", feature = "mysql", feature = "zookeeper")))]
mod tests {
    use super::*;

    fn matches(pattern: &str, text: &str) -> bool {
        Glob::parse(pattern).expect("a valid pattern").matches(text)
    }

    #[test]
    fn stars_questions_and_literals_match_as_redis_does() {
        assert!(matches("lock:{stock:*}*", "lock:{stock:1}"));
        assert!(matches("lock:{stock:*}*", "lock:{stock:1}#3"));
        assert!(!matches("lock:{stock:*}*", "lock:{stocks}"));
        assert!(matches("*", ""));
        assert!(matches("a*b*c", "aXbYbc"));
        assert!(!matches("a*b*c", "aXbYbd"));
        assert!(matches("st?ck", "stock"));
        assert!(!matches("st?ck", "stck"));
        assert!(matches("a\\*b", "a*b"));
        assert!(!matches("a\\*b", "aXb"));
        assert!(matches("é?", "éa"));
    }

    #[test]
    fn classes_take_ranges_negation_and_escapes() {
        assert!(matches("stock:[0-9]", "stock:7"));
        assert!(!matches("stock:[2-9]", "stock:1"));
        assert!(matches("[^a-c.]x", "dx"));
        assert!(!matches("[^a-c.]x", ".x"));
        assert!(matches("[]]", "]"));
        assert!(matches("[a-]", "-"));
        assert!(matches("[\\]a]", "]"));
        assert!(matches("[9-0]", "5"), "a reversed range is the same range");
    }

    #[test]
    fn an_unclosed_bracket_or_a_trailing_escape_is_refused() {
        assert!(Glob::parse("stock[12").is_none());
        assert!(Glob::parse("stock\\").is_none());
        assert!(Glob::parse("[").is_none());
    }
}
