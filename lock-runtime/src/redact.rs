//! Secrets out of every message: a URL's credentials never reach an error,
//! a log line or `Debug` output, whatever characters they hold. Every
//! backend quotes its URL through these.

/// The URL with any credentials replaced by `***`, for messages.
///
/// It must work on URLs that do not parse, since those are exactly the ones
/// that end up in errors, and a generated password may hold any character,
/// `/`, `?`, `#` and `@` included. So nothing is guessed from the password's
/// content: everything between `://` and the *last* `@` of the URL is
/// credentials. (A path or query that contains `@` is redacted too: more
/// than needed, never less.) A `pass`/`password` query parameter, which
/// `redis+unix://` URLs use, takes the whole query with it.
pub(crate) fn redact_url(url: &str) -> String {
    let (head, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    // No authority (`redis+unix:///path?pass=...`): no userinfo either, and
    // the query may hold credentials with any character in them.
    if rest.starts_with('/') {
        return match rest.find('?') {
            Some(q) => format!("{head}{}?***", &rest[..q]),
            None => url.to_owned(),
        };
    }
    let rest = match rest.rfind('@') {
        Some(at) => format!("***{}", &rest[at..]),
        None => rest.to_owned(),
    };
    let rest = match rest.find('?') {
        Some(q) if rest[q..].to_ascii_lowercase().contains("pass") => format!("{}?***", &rest[..q]),
        _ => rest,
    };
    format!("{head}{rest}")
}

/// Removes the URL's secrets from a message that may quote the URL, or the
/// password alone, raw or percent-decoded (as the redis crate holds it).
pub(crate) fn redact_secrets(message: &str, url: &str) -> String {
    let mut out = message.replace(url, &redact_url(url));
    for secret in secrets_of(url) {
        if secret.is_empty() {
            continue;
        }
        out = out.replace(&secret, "***");
    }
    out
}

/// The secrets a URL carries, in every spelling a message might quote: the
/// userinfo's password (and the whole userinfo), and `pass` query values.
fn secrets_of(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let mut raw: Vec<&str> = Vec::new();
    // A userinfo without `:` is a user name alone: no secret, and masking
    // it would mangle every word of a message that holds it (a user `locks`
    // made the table `distributed_locks` read `distributed_***`).
    if let Some((userinfo, _)) = rest.rsplit_once('@')
        && let Some((_, password)) = userinfo.split_once(':')
    {
        raw.push(userinfo);
        raw.push(password);
    }
    if let Some((_, query)) = rest.split_once('?') {
        raw.extend(
            query
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .filter(|(k, _)| k.to_ascii_lowercase().contains("pass"))
                .map(|(_, v)| v),
        );
    }
    let mut found: Vec<String> = Vec::new();
    for secret in raw.into_iter().filter(|s| !s.is_empty()) {
        found.push(secret.to_owned());
        // The redis crate holds the password decoded, and may quote it so.
        let decoded = percent_encoding::percent_decode_str(secret).decode_utf8_lossy();
        if decoded != secret {
            found.push(decoded.into_owned());
        }
    }
    // Longest first, so that a password inside the userinfo does not leave
    // half of the userinfo behind.
    found.sort_by_key(|s| std::cmp::Reverse(s.len()));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_survive_redaction() {
        assert_eq!(redact_url("redis://:hunter2@db:6379/0"), "redis://***@db:6379/0");
        assert_eq!(redact_url("redis://app:hunter2@db"), "redis://***@db");
        assert_eq!(redact_url("redis://db:6379"), "redis://db:6379");
        assert_eq!(redact_url("redis//app:hunter2@db"), "***@db");
        assert_eq!(redact_url("redis://app:a/b?c#d@db:1/0"), "redis://***@db:1/0");
        assert_eq!(
            redact_url("redis+unix:///tmp/r.sock?pass=hunter2"),
            "redis+unix:///tmp/r.sock?***"
        );
        let msg = redact_secrets("bad url redis://u:hunter2@x: hunter2", "redis://u:hunter2@x");
        assert!(!msg.contains("hunter2"), "{msg}");
        let msg = redact_secrets("password `a/b` refused", "redis://u:a%2Fb@x");
        assert!(!msg.contains("a/b"), "{msg}");
        let msg = redact_secrets(
            "type \"distributed_locks\" already exists",
            "postgres://locks@db/locks",
        );
        assert_eq!(
            msg, "type \"distributed_locks\" already exists",
            "a user name alone is no secret"
        );
    }

    /// Every printable ASCII character, alone in a password and all of them
    /// in one: no fragment of the password survives in any URL shape.
    #[test]
    fn passwords_of_every_printable_character_are_redacted() {
        let mut passwords: Vec<String> = (0x20u8..0x7f)
            .map(|c| format!("Zq7{}Wv3", char::from(c)))
            .collect();
        passwords.push((0x20u8..0x7f).map(char::from).collect::<String>() + "Zq7Wv3");
        for password in &passwords {
            for url in [
                format!("redis://app:{password}@127.0.0.1:6379/0"),
                format!("redis://:{password}@db"),
                format!("rediss://app:{password}@db:6380"),
                format!("redis//app:{password}@db"),
                format!("redis+unix:///tmp/r.sock?db=0&pass={password}"),
            ] {
                let shown = redact_url(&url);
                assert!(
                    !shown.contains("Zq7") && !shown.contains("Wv3"),
                    "{url} -> {shown}"
                );
            }
        }
    }
}
