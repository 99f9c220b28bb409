//! Durations as users write them: `500ms`, `30s`, `5m`, `1h`, `1m30s`.
//! Parsed at compile time, so a typo is a compile error, never a run-time one.

pub(crate) const GRAMMAR: &str =
    "write whole numbers with `ms`, `s`, `m` or `h`, largest unit first, e.g. \"500ms\", \"30s\", \"1m30s\"";

/// Milliseconds in `text`, or what is wrong with it.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    if text.is_empty() {
        return Err(format!("empty duration; {GRAMMAR}"));
    }
    let mut total: u64 = 0;
    let mut last_unit_rank = u8::MAX;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("`{text}` is not a duration; {GRAMMAR}"));
        }
        let (number, after) = rest.split_at(digits);
        let unit_len = after.find(|c: char| c.is_ascii_digit()).unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let (factor, rank) = match unit {
            "h" => (3_600_000, 3),
            "m" => (60_000, 2),
            "s" => (1_000, 1),
            "ms" => (1, 0),
            "" => return Err(format!("`{text}` has no unit after `{number}`; {GRAMMAR}")),
            fraction if fraction.starts_with('.') => return Err(fraction_hint(text, number, after)),
            other => return Err(format!("unknown unit `{other}` in `{text}`; {GRAMMAR}")),
        };
        if rank >= last_unit_rank {
            return Err(format!(
                "units in `{text}` must each appear once, largest first; {GRAMMAR}"
            ));
        }
        last_unit_rank = rank;
        let value: u64 = number
            .parse()
            .map_err(|_| format!("`{number}` in `{text}` is too large"))?;
        total = value
            .checked_mul(factor)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(|| format!("`{text}` is too large"))?;
        rest = after;
    }
    Ok(total)
}

/// `1.5s`: say so, and give the same duration in whole milliseconds when
/// there is one. `after_dot` is what follows the `.`: `5s` of `1.5s`.
fn fraction_hint(text: &str, whole: &str, after_dot: &str) -> String {
    let digits = after_dot
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(after_dot.len());
    let (fraction, unit) = after_dot.split_at(digits);
    let factor: Option<u64> = match unit {
        "h" => Some(3_600_000),
        "m" => Some(60_000),
        "s" => Some(1_000),
        _ => None,
    };
    let exact = factor.and_then(|factor| {
        let scale = 10u64.checked_pow(u32::try_from(fraction.len()).ok()?)?;
        let part_ms = fraction.parse::<u64>().ok()?.checked_mul(factor)?;
        if !part_ms.is_multiple_of(scale) {
            return None;
        }
        whole
            .parse::<u64>()
            .ok()?
            .checked_mul(factor)?
            .checked_add(part_ms / scale)
    });
    match exact {
        Some(ms) => format!("fractions are not supported in `{text}`; write \"{ms}ms\""),
        None => format!("fractions are not supported in `{text}`; {GRAMMAR}"),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_millis;

    #[test]
    fn accepts_the_documented_forms() {
        assert_eq!(parse_millis("500ms"), Ok(500));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("5m"), Ok(300_000));
        assert_eq!(parse_millis("1h"), Ok(3_600_000));
        assert_eq!(parse_millis("1m30s"), Ok(90_000));
        assert_eq!(parse_millis("1h2m3s4ms"), Ok(3_723_004));
        assert_eq!(parse_millis("0s"), Ok(0));
    }

    #[test]
    fn refuses_everything_else_with_a_reason() {
        for (input, says) in [
            ("", "empty"),
            ("5", "no unit"),
            ("5 sec", "unknown unit ` sec`"),
            ("5S", "unknown unit `S`"),
            ("-1s", "not a duration"),
            ("1.5s", "fractions are not supported in `1.5s`; write \"1500ms\""),
            ("0.25m", "write \"15000ms\""),
            ("1.0001s", "fractions are not supported"),
            ("1.5ms", "fractions are not supported"),
            ("500us", "unknown unit `us`"),
            ("30s1m", "largest first"),
            ("1s1s", "largest first"),
            ("99999999999999999999ms", "too large"),
            ("999999999999999h", "too large"),
        ] {
            let err = parse_millis(input).expect_err(input);
            assert!(err.contains(says), "{input}: {err}");
        }
    }
}
