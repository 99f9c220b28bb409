//! A URL's credentials, whatever characters they hold: read as the user
//! meant them, and never shown in an error, a log line or `Debug` output.
//! Every backend takes its URL through [`escape_userinfo`] and quotes it
//! through the redaction functions.

use std::borrow::Cow;

/// The URL with its user and password percent-encoded where they hold
/// characters a URL parser would take for the end of the userinfo (`@`,
/// `/`, `?`, `#`, ...), so that each driver reads the password given.
///
/// Generated passwords hold such characters, and the drivers read them
/// differently: tokio-postgres ends the userinfo at the *first* `@` (the
/// rest of the password became the host, and was shown as the node name),
/// the MySQL and Redis parsers stop at `/`, `?` or `#`.
///
/// A URL that is well formed as written is left alone: its authority (up
/// to the first `/`, `?` or `#`) is `[userinfo@]host[:port]` with a clean
/// userinfo, and its path holds no `@`. So an `@` in a query
/// (`?application_name=a@b`) keeps working. Any other URL with an `@` is
/// read by the rule [`redact_url`] uses: everything between `://` and the
/// last `@` is the user and password. A `%` followed by two hex digits is
/// an escape the user already wrote and is kept; any other `%` is a
/// character of the password. URLs without an authority (Unix sockets) and
/// connection strings that are not URLs are returned as given.
pub(crate) fn escape_userinfo(url: &str) -> Cow<'_, str> {
    if is_key_values(url) {
        return Cow::Borrowed(url);
    }
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return Cow::Borrowed(url);
    };
    let rest = &url[start..];
    let Some(at) = rest.rfind('@').filter(|_| !rest.starts_with('/')) else {
        return Cow::Borrowed(url);
    };
    if well_formed(rest) {
        return Cow::Borrowed(url);
    }
    let userinfo = &rest[..at];
    // A user name cannot hold a raw `:` in a URL; the password can.
    let escaped = match userinfo.split_once(':') {
        Some((user, password)) => format!("{}:{}", percent_encode(user), percent_encode(password)),
        None => percent_encode(userinfo),
    };
    Cow::Owned(format!("{}{escaped}{}", &url[..start], &rest[at..]))
}

/// Whether the URL after `://` parses as written: an authority of a clean
/// userinfo and `host[:port]` (or several, comma-separated, as PostgreSQL
/// takes them), and a path without `@`.
fn well_formed(rest: &str) -> bool {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, after) = rest.split_at(end);
    let path = &after[..after.find(['?', '#']).unwrap_or(after.len())];
    if path.contains('@') {
        return false;
    }
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };
    let clean = |text: &str| {
        let bytes = text.as_bytes();
        bytes.iter().enumerate().all(|(i, &b)| match b {
            b'%' => is_escape(&bytes[i..]),
            b':' => true,
            _ => unreserved(b) || b"!$&'()*+,;=".contains(&b),
        })
    };
    let host_port = |item: &str| {
        let (host, port) = match item.rsplit_once(':').filter(|(h, _)| !h.ends_with(':')) {
            Some((host, port)) if !host.starts_with('[') || host.ends_with(']') => (host, Some(port)),
            _ => (item, None),
        };
        !host.is_empty()
            && !host.contains('@')
            && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    };
    userinfo.is_none_or(clean) && hosts.split(',').all(host_port)
}

/// What a URL that did not parse should be told: a URL with credentials
/// may have failed on its password's characters.
pub(crate) fn unparsed_hint(url: &str) -> &'static str {
    if url.contains('@') && !is_key_values(url) {
        "; if the password holds characters such as `@`, `/`, `?`, `#` or `%`, percent-encode them (`@` as `%40`)"
    } else {
        ""
    }
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~".contains(&b)
}

/// Whether `bytes` begin with `%` and two hex digits.
fn is_escape(bytes: &[u8]) -> bool {
    bytes.len() >= 3 && bytes[0] == b'%' && bytes[1].is_ascii_hexdigit() && bytes[2].is_ascii_hexdigit()
}

/// Every byte but unreserved ones and escapes already written as `%XX`.
/// By hand: the `percent-encoding` crate encodes every `%`, and would turn
/// a password the user had already encoded into another one.
fn percent_encode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len() * 3);
    for (i, &b) in bytes.iter().enumerate() {
        if unreserved(b) || is_escape(&bytes[i..]) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

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
    if is_key_values(url) {
        return redact_key_values(url);
    }
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

/// Whether `text` is a key-value connection string (`host=db ...`) rather
/// than a URL, well-formed or not: it begins with a word and `=`.
fn is_key_values(text: &str) -> bool {
    text.trim_start().split_once('=').is_some_and(|(key, _)| {
        let key = key.trim_end();
        !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    })
}

/// A PostgreSQL key-value connection string (`host=db password='a b'`)
/// with every `pass...` value replaced by `***`, quoted or not.
fn redact_key_values(text: &str) -> String {
    key_values(text)
        .map(|(key, value, _)| match value {
            Some(_) if key.to_ascii_lowercase().contains("pass") => format!("{key}=***"),
            Some(value) => format!("{key}={value}"),
            None => key.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `key=value` pairs of a connection string: each key, its value as
/// written (quotes and escapes included), and the value it stands for. A
/// word without `=` comes back as a key without a value. Written here, not
/// taken from the driver, because it must also split strings the driver
/// refuses, and those are the ones quoted in errors.
fn key_values(text: &str) -> impl Iterator<Item = (&str, Option<&str>, String)> {
    let mut rest = text;
    std::iter::from_fn(move || {
        rest = rest.trim_start();
        if rest.is_empty() {
            return None;
        }
        let key_end = rest
            .find(|c: char| c == '=' || c.is_whitespace())
            .unwrap_or(rest.len());
        let key = &rest[..key_end];
        let after_key = rest[key_end..].trim_start();
        let Some(after_eq) = after_key.strip_prefix('=') else {
            rest = &rest[key_end..];
            return Some((key, None, String::new()));
        };
        let value_text = after_eq.trim_start();
        let mut meant = String::new();
        let mut end = value_text.len();
        if let Some(quoted) = value_text.strip_prefix('\'') {
            let mut chars = quoted.char_indices();
            end = value_text.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => meant.extend(chars.next().map(|(_, c)| c)),
                    '\'' => {
                        end = i + 2;
                        break;
                    }
                    c => meant.push(c),
                }
            }
        } else {
            let mut chars = value_text.char_indices();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => meant.extend(chars.next().map(|(_, c)| c)),
                    c if c.is_whitespace() => {
                        end = i;
                        break;
                    }
                    c => meant.push(c),
                }
            }
        }
        let value = &value_text[..end];
        rest = &value_text[end..];
        Some((key, Some(value), meant))
    })
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
    let mut raw: Vec<&str> = Vec::new();
    let mut meant: Vec<String> = Vec::new();
    if is_key_values(url) {
        for (key, value, value_meant) in key_values(url) {
            if let Some(value) = value.filter(|_| key.to_ascii_lowercase().contains("pass")) {
                raw.push(value);
                meant.push(value_meant);
            }
        }
    }
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
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
    let mut found: Vec<String> = meant.into_iter().filter(|s| !s.is_empty()).collect();
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

    #[test]
    fn userinfo_is_escaped_only_where_a_parser_would_misread_it() {
        for plain in [
            "redis://app:s3cr3t@db:6379/0",
            "postgres://app:a%40b@db/locks",
            "mysql://app:a!$&'()*+,;=b@db/locks",
            "redis+unix:///tmp/r.sock?pass=a@b",
            "host=db password=a@b dbname=locks",
            "redis://db:6379",
        ] {
            assert_eq!(escape_userinfo(plain), plain);
        }
        assert_eq!(
            escape_userinfo("postgres://app:Zq7@/#?:%Wv3@127.0.0.1:5432/locks?sslmode=require"),
            "postgres://app:Zq7%40%2F%23%3F%3A%25Wv3@127.0.0.1:5432/locks?sslmode=require"
        );
        // Well formed as written: an `@` in the query, a `:` in the
        // password, several hosts.
        for kept in [
            "postgres://db:5432/locks?application_name=a@b",
            "postgres://app:pw@db/locks?application_name=a@b",
            "mysql://app:Zq7:Wv3@127.0.0.1:3306/locks",
            "postgres://app:pw@h1:5432,h2:5433/locks",
            "postgres://app:pw@[::1]:5432/locks",
        ] {
            assert_eq!(escape_userinfo(kept), kept);
        }
        assert_eq!(escape_userinfo("redis://:Zq7/Wv3@db"), "redis://:Zq7%2FWv3@db");
        assert_eq!(
            escape_userinfo("redis://app:1234/5@db/0"),
            "redis://app:1234%2F5@db/0"
        );
        assert_eq!(
            escape_userinfo("host=db password=a://b@c dbname=x"),
            "host=db password=a://b@c dbname=x"
        );
        // An escape already written is kept; a lone `%` is a character.
        assert_eq!(escape_userinfo("redis://:a%2Fb/c@db"), "redis://:a%2Fb%2Fc@db");
        assert_eq!(escape_userinfo("redis://:100%@db"), "redis://:100%25@db");
        assert_eq!(
            escape_userinfo("mysql://me@corp:p/w@db/x"),
            "mysql://me%40corp:p%2Fw@db/x"
        );
    }

    #[test]
    fn key_value_strings_keep_their_passwords_out_of_messages() {
        let kv = "host=127.0.0.1 port=5432 user=app password=Zq7@/#?:%Wv3 dbname=locks";
        let shown = redact_url(kv);
        assert_eq!(
            shown,
            "host=127.0.0.1 port=5432 user=app password=*** dbname=locks"
        );
        let kv = r"host=db password = 'Zq7 \'q\\ Wv3' sslpassword=Zq8 dbname=locks";
        let shown = redact_url(kv);
        assert!(
            !shown.contains("Zq7") && !shown.contains("Wv3") && !shown.contains("Zq8"),
            "{shown}"
        );
        assert!(shown.ends_with("dbname=locks"), "{shown}");
        assert_eq!(
            redact_url("host=db password=Zq7://Wv3@x dbname=locks"),
            "host=db password=*** dbname=locks"
        );
        let msg = redact_secrets("authentication failed for `Zq7 'q\\ Wv3`", kv);
        assert!(!msg.contains("Zq7"), "{msg}");
    }
}
