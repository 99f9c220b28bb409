//! The attribute's arguments: `key = "..."`, `ttl = "30s"`, `wait = "5s"`,
//! `renew = false`, `fencing = true`, and the lock's kind: `mode = "read"`,
//! `permits = N` or `segments = N`; `on_busy = "skip"` for a call that
//! skips its body rather than fail when the lock is busy; `hold_at_least =
//! "55m"` for a job whose lock must outlast a short run.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, Ident, Lit, LitBool, LitStr, Token};

use crate::duration;
use crate::errors::{Errors, backticked, closest};

const ARGUMENTS: [&str; 12] = [
    "key",
    "keys",
    "ttl",
    "wait",
    "renew",
    "fencing",
    "mode",
    "permits",
    "segments",
    "fair",
    "on_busy",
    "hold_at_least",
];

/// The most keys one call may lock (the runtime's bound too).
pub(crate) const MAX_KEYS: usize = 64;

/// The most segments a lock may have (the runtime's bound too).
pub(crate) const MAX_SEGMENTS: u32 = 1024;

/// The longest `wait` accepted: a longer one is almost always a unit typo
/// (`"5000s"` for `"5000ms"`), and a caller stuck that long is an outage.
pub(crate) const MAX_WAIT_MS: u64 = 3_600_000;
/// The shortest lease accepted: the runtime refuses shorter ones at every
/// call (`ttl > 1% + 2ms drift + 5ms stop margin`), so a shorter literal
/// could only compile into a function that always fails.
pub(crate) const MIN_TTL_MS: u64 = 8;
/// The longest lease accepted: past a day, a renewed lease gains nothing and
/// a fixed one outlives any crash it should cover.
pub(crate) const MAX_TTL_MS: u64 = 86_400_000;
/// The longest `hold_at_least` (the runtime's bound too): a week, for a
/// weekly job.
pub(crate) const MAX_HOLD_MS: u64 = 7 * 86_400_000;

/// A duration argument: its value and the literal it came from.
#[derive(Debug, Clone)]
pub(crate) struct DurationArg {
    pub(crate) millis: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Args {
    pub(crate) key: Option<LitStr>,
    /// `keys = ["...", ...]`: several keys, all or none.
    pub(crate) keys: Option<Vec<LitStr>>,
    pub(crate) ttl: Option<DurationArg>,
    pub(crate) wait: Option<DurationArg>,
    pub(crate) renew: Option<bool>,
    pub(crate) fencing: Option<bool>,
    pub(crate) mode: Option<Mode>,
    pub(crate) permits: Option<u32>,
    pub(crate) segments: Option<u32>,
    pub(crate) fair: Option<bool>,
    pub(crate) on_busy: Option<OnBusy>,
    pub(crate) hold_at_least: Option<DurationArg>,
}

/// `on_busy = "wait"` (the default: `Timeout` after `wait`) or
/// `on_busy = "skip"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnBusy {
    Wait,
    Skip,
}

/// `mode = "read"` or `mode = "write"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Read,
    Write,
}

/// `name = value`, before its meaning is checked.
struct RawArg {
    name: Ident,
    value: Expr,
}

impl Parse for RawArg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let name = Ident::parse_any(input).map_err(|e| {
            syn::Error::new(
                e.span(),
                format!("expected an argument name: {}", backticked(ARGUMENTS)),
            )
        })?;
        // Spanned at the name: at the end of the arguments, the parser's own
        // span would cover the whole attribute.
        input.parse::<Token![=]>().map_err(|_| {
            let example = match name.to_string().as_str() {
                "fencing" => "fencing = true".to_owned(),
                "fair" => "fair = true".to_owned(),
                "keys" => "keys = [\"a:<x>\", \"b:<y>\"]".to_owned(),
                "mode" => "mode = \"read\"".to_owned(),
                "on_busy" => "on_busy = \"skip\"".to_owned(),
                "permits" | "segments" => format!("{name} = 4"),
                "renew" => "renew = false".to_owned(),
                other => format!("{other} = ..."),
            };
            syn::Error::new(name.span(), format!("`{name}` needs a value: write `{example}`"))
        })?;
        Ok(RawArg {
            name,
            value: input.parse()?,
        })
    }
}

impl Args {
    /// Parses and checks the arguments into `errors`, returning what was
    /// valid so that the rest of the attribute can still be checked.
    pub(crate) fn parse(tokens: proc_macro2::TokenStream, errors: &mut Errors) -> Args {
        let mut args = Args::default();
        let raw = match syn::parse::Parser::parse2(Punctuated::<RawArg, Token![,]>::parse_terminated, tokens)
        {
            Ok(raw) => raw,
            Err(error) => {
                errors.push(error);
                return args;
            }
        };
        let mut seen: Vec<Ident> = Vec::new();
        for RawArg { name, value } in raw {
            let label = name.to_string();
            if seen.iter().any(|s| *s == label) {
                errors.push_at(name.span(), format!("duplicate `{label}` argument: give it once"));
                continue;
            }
            seen.push(name.clone());
            match label.as_str() {
                "key" => args.key = string_arg(&label, &value, errors),
                "keys" => args.keys = keys_arg(&value, errors),
                "ttl" => args.ttl = duration_arg(&label, &value, errors),
                "wait" => args.wait = duration_arg(&label, &value, errors),
                "hold_at_least" => args.hold_at_least = duration_arg(&label, &value, errors),
                "renew" => args.renew = bool_arg(&label, &value, errors),
                "fencing" => args.fencing = bool_arg(&label, &value, errors),
                "fair" => args.fair = bool_arg(&label, &value, errors),
                "mode" => {
                    args.mode = choice_arg(
                        &label,
                        &value,
                        [("read", Mode::Read), ("write", Mode::Write)],
                        "write `mode = \"read\"` or `mode = \"write\"`",
                        errors,
                    );
                }
                "on_busy" => {
                    args.on_busy = choice_arg(
                        &label,
                        &value,
                        [("skip", OnBusy::Skip), ("wait", OnBusy::Wait)],
                        "write `on_busy = \"skip\"` to return without running the body when another holder has the lock, or `on_busy = \"wait\"` (the default) to fail with `Timeout`",
                        errors,
                    );
                }
                "permits" => args.permits = count_arg(&label, &value, u32::MAX, errors),
                "segments" => args.segments = count_arg(&label, &value, MAX_SEGMENTS, errors),
                other => {
                    let hint = closest(other, ARGUMENTS)
                        .map(|c| format!("did you mean `{c}`? "))
                        .unwrap_or_default();
                    errors.push_at(
                        name.span(),
                        format!(
                            "unknown argument `{other}`; {hint}arguments are {}",
                            backticked(ARGUMENTS)
                        ),
                    );
                }
            }
        }
        let given = |name: &str| seen.iter().find(|s| *s == name);
        match (given("key"), given("keys")) {
            (Some(_), Some(keys)) => errors.push_at(
                keys.span(),
                "`keys` cannot be combined with `key`: give one key as `key = \"...\"`, or several as `keys = [...]`",
            ),
            (None, None) => errors.push_at(
                Span::call_site(),
                "missing `key`: write `#[distributed_lock(key = \"name:<param>\")]`",
            ),
            _ => {}
        }
        if let Some(at) = given("keys") {
            for other in ["mode", "permits", "segments", "fencing", "hold_at_least"] {
                if given(other).is_some() && (other != "fencing" || args.fencing == Some(true)) {
                    errors.push_at(
                        at.span(),
                        format!("`keys` cannot be combined with `{other}`: a set of keys takes exclusive locks, without a fencing token or a hold after its body"),
                    );
                }
            }
        }
        args.check_kind(&seen, errors);
        args
    }

    /// A lock is one kind: `mode`, `permits` and `segments` exclude each
    /// other, and a shared lock has no use for a fencing token.
    fn check_kind(&self, seen: &[Ident], errors: &mut Errors) {
        let given = |name: &str| seen.iter().find(|s| *s == name);
        for (a, b) in [("permits", "mode"), ("segments", "mode"), ("segments", "permits")] {
            if let (Some(at), Some(_)) = (given(a), given(b)) {
                errors.push_at(
                    at.span(),
                    format!("`{a}` cannot be combined with `{b}`: a lock is one kind; give one of them"),
                );
            }
        }
        if self.fair == Some(true) {
            for other in ["mode", "permits", "segments", "keys"] {
                if let (Some(at), Some(_)) = (given("fair"), given(other)) {
                    errors.push_at(
                        at.span(),
                        format!("`fair` cannot be combined with `{other}`: a fair lock is one exclusive lock handed out in arrival order"),
                    );
                }
            }
        }
        if let Some(at) = given("hold_at_least") {
            for other in ["mode", "permits", "segments", "fair"] {
                if given(other).is_some() && (other != "fair" || self.fair == Some(true)) {
                    errors.push_at(
                        at.span(),
                        format!("`hold_at_least` cannot be combined with `{other}`: it keeps an exclusive lock held after its body, and would hold back the lock's other holders or its next in line with no one running"),
                    );
                }
            }
        }
        if self.fencing == Some(true) {
            let shared = if self.mode == Some(Mode::Read) {
                Some("mode = \"read\"")
            } else if given("permits").is_some() {
                Some("permits")
            } else {
                None
            };
            if let (Some(shared), Some(at)) = (shared, given("fencing")) {
                errors.push_at(
                    at.span(),
                    format!(
                        "`fencing` cannot be combined with `{shared}`: holders of a shared lock run side by side, so a token would order nothing"
                    ),
                );
            }
        }
    }
}

fn keys_arg(value: &Expr, errors: &mut Errors) -> Option<Vec<LitStr>> {
    let shape =
        "`keys` must be a list of string literals, e.g. `keys = [\"account:<from>\", \"account:<to>\"]`";
    let Expr::Array(array) = value else {
        errors.push(syn::Error::new_spanned(value, shape));
        return None;
    };
    let mut keys = Vec::new();
    for element in &array.elems {
        match literal(element) {
            Some(Lit::Str(s)) => keys.push(s.clone()),
            _ => {
                errors.push(syn::Error::new_spanned(element, shape));
                return None;
            }
        }
    }
    if keys.is_empty() {
        errors.push(syn::Error::new_spanned(
            value,
            "`keys` is empty: give at least one key",
        ));
        return None;
    }
    if keys.len() > MAX_KEYS {
        errors.push(syn::Error::new_spanned(
            value,
            format!(
                "`keys` names {} keys; a call may lock at most {MAX_KEYS}",
                keys.len()
            ),
        ));
        return None;
    }
    Some(keys)
}

/// A string argument naming one of two `choices`; `hint` says what each
/// means when something else is given.
fn choice_arg<T: Copy>(
    name: &str,
    value: &Expr,
    choices: [(&str, T); 2],
    hint: &str,
    errors: &mut Errors,
) -> Option<T> {
    let Some(Lit::Str(s)) = literal(value) else {
        let [(a, _), (b, _)] = choices;
        errors.push(syn::Error::new_spanned(
            value,
            format!("`{name}` must be the string \"{a}\" or \"{b}\""),
        ));
        return None;
    };
    let given = s.value();
    if let Some((_, chosen)) = choices.iter().find(|(choice, _)| *choice == given) {
        return Some(*chosen);
    }
    errors.push_at(s.span(), format!("unknown `{name}` \"{given}\": {hint}"));
    None
}

fn count_arg(name: &str, value: &Expr, max: u32, errors: &mut Errors) -> Option<u32> {
    let Some(Lit::Int(int)) = literal(value) else {
        errors.push(syn::Error::new_spanned(
            value,
            format!("`{name}` must be an integer literal, e.g. `{name} = 4`"),
        ));
        return None;
    };
    match int.base10_parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Some(n),
        _ => {
            let range = if max == u32::MAX {
                "at least 1".to_owned()
            } else {
                format!("from 1 to {max}")
            };
            errors.push_at(
                int.span(),
                format!("`{name}` must be {range}, not {}", int.base10_digits()),
            );
            None
        }
    }
}

fn literal(value: &Expr) -> Option<&Lit> {
    match value {
        Expr::Lit(ExprLit { lit, .. }) => Some(lit),
        Expr::Group(group) => literal(&group.expr),
        _ => None,
    }
}

fn string_arg(name: &str, value: &Expr, errors: &mut Errors) -> Option<LitStr> {
    match literal(value) {
        Some(Lit::Str(s)) => Some(s.clone()),
        _ => {
            errors.push(syn::Error::new_spanned(
                value,
                format!("`{name}` must be a string literal, e.g. `{name} = \"order:<order_id>\"`"),
            ));
            None
        }
    }
}

fn bool_arg(name: &str, value: &Expr, errors: &mut Errors) -> Option<bool> {
    match literal(value) {
        Some(Lit::Bool(LitBool { value, .. })) => Some(*value),
        _ => {
            errors.push(syn::Error::new_spanned(
                value,
                format!("`{name}` must be `true` or `false`"),
            ));
            None
        }
    }
}

fn duration_arg(name: &str, value: &Expr, errors: &mut Errors) -> Option<DurationArg> {
    let Some(Lit::Str(text)) = literal(value) else {
        errors.push(syn::Error::new_spanned(
            value,
            format!(
                "`{name}` must be a string such as `{name} = \"30s\"`; {}",
                duration::GRAMMAR
            ),
        ));
        return None;
    };
    let millis = match duration::parse_millis(&text.value()) {
        Ok(ms) => ms,
        Err(reason) => {
            errors.push_at(text.span(), format!("invalid `{name}`: {reason}"));
            return None;
        }
    };
    let problem = match name {
        "ttl" if millis < MIN_TTL_MS => Some(format!(
            "`ttl` must be at least {MIN_TTL_MS}ms: a shorter lease leaves no time to work after the 2ms clock-drift allowance and the 5ms stop margin"
        )),
        "ttl" if millis > MAX_TTL_MS => Some(format!(
            "`ttl` of {} is over the 24h limit; leases that long outlive the crashes they should cover",
            text.value()
        )),
        "hold_at_least" if millis == 0 => {
            Some("`hold_at_least` of 0 holds nothing: leave it out, or give at least 1ms".to_owned())
        }
        "hold_at_least" if millis > MAX_HOLD_MS => Some(format!(
            "`hold_at_least` of {} is over the 7-day limit; for a job that runs less often, name its run in the key (`Tick`)",
            text.value()
        )),
        "wait" if millis > MAX_WAIT_MS => Some(format!(
            "`wait` of {} is over the 1h limit, which is likely a unit typo (`ms` for `s`?)",
            text.value()
        )),
        _ => None,
    };
    if let Some(problem) = problem {
        errors.push_at(text.span(), problem);
        return None;
    }
    Some(DurationArg { millis })
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn problems(tokens: proc_macro2::TokenStream) -> String {
        let mut errors = Errors::default();
        Args::parse(tokens, &mut errors);
        errors.finish(()).err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn durations_are_bounded_as_documented() {
        assert!(problems(quote!(key = "k", ttl = "24h")).is_empty());
        assert!(problems(quote!(key = "k", ttl = "24h1ms")).contains("over the 24h limit"));
        assert!(problems(quote!(key = "k", ttl = "8ms", wait = "1h")).is_empty());
        assert!(problems(quote!(key = "k", ttl = "7ms")).contains("at least 8ms"));
        assert!(problems(quote!(key = "k", fencing)).contains("write `fencing = true`"));
        assert!(problems(quote!(key = "k", wait = "1h1s")).contains("over the 1h limit"));
        assert!(problems(quote!(key = "k", renew = "no")).contains("`true` or `false`"));
    }

    #[test]
    fn kinds_are_checked() {
        assert!(problems(quote!(key = "k", mode = "read")).is_empty());
        assert!(problems(quote!(key = "k", mode = "write", fencing = true)).is_empty());
        assert!(problems(quote!(key = "k", permits = 3)).is_empty());
        assert!(problems(quote!(key = "k", segments = 1024)).is_empty());
        assert!(problems(quote!(key = "k", mode = "reed")).contains("unknown `mode`"));
        assert!(problems(quote!(key = "k", on_busy = "skip")).is_empty());
        assert!(problems(quote!(key = "k", on_busy = "skip", hold_at_least = "55m")).is_empty());
        assert!(problems(quote!(key = "k", hold_at_least = "0s")).contains("holds nothing"));
        assert!(problems(quote!(key = "k", hold_at_least = "169h")).contains("7-day limit"));
        assert!(problems(quote!(key = "k", hold_at_least = 5)).contains("must be a string"));
        assert!(
            problems(quote!(key = "k", hold_at_least = "1s", mode = "read"))
                .contains("cannot be combined with `mode`")
        );
        assert!(
            problems(quote!(key = "k", hold_at_least = "1s", fair = true))
                .contains("cannot be combined with `fair`")
        );
        assert!(problems(quote!(key = "k", hold_at_least = "1s", fair = false)).is_empty());
        assert!(
            problems(quote!(keys = ["a", "b"], hold_at_least = "1s"))
                .contains("cannot be combined with `hold_at_least`")
        );
        assert!(problems(quote!(key = "k", on_busy = "wait", wait = "1s")).is_empty());
        assert!(problems(quote!(key = "k", on_busy = "skipp")).contains("unknown `on_busy`"));
        assert!(problems(quote!(key = "k", on_busy = true)).contains("\"skip\" or \"wait\""));
        assert!(problems(quote!(key = "k", permits = 0)).contains("at least 1"));
        assert!(problems(quote!(key = "k", segments = 1025)).contains("from 1 to 1024"));
        assert!(
            problems(quote!(key = "k", segments = 2, permits = 2))
                .contains("`segments` cannot be combined with `permits`")
        );
        assert!(
            problems(quote!(key = "k", mode = "read", permits = 2))
                .contains("`permits` cannot be combined with `mode`")
        );
        assert!(
            problems(quote!(key = "k", mode = "read", fencing = true))
                .contains("`fencing` cannot be combined")
        );
    }
}
