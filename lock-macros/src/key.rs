//! Key templates: literal text with `<param>`, `<param.field>` and
//! `<self.field>` placeholders; `<<` and `>>` stand for `<` and `>`.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::LitStr;

use crate::errors::{Errors, backticked, closest};
use crate::item::Params;

/// Longest literal text accepted; the runtime enforces the same limit on the
/// rendered key.
const MAX_KEY_BYTES: usize = 1024;

#[derive(Debug, PartialEq)]
enum Segment {
    Text(String),
    /// `root.field.field`: the path into a parameter.
    Placeholder(Vec<String>),
}

/// A key template checked against the function's parameters.
#[derive(Debug)]
pub(crate) struct Template {
    segments: Vec<Segment>,
    span: Span,
}

impl Template {
    /// Parses `lit`, reporting every problem into `errors`.
    pub(crate) fn parse(lit: &LitStr, params: &Params, errors: &mut Errors) -> Option<Template> {
        let text = lit.value();
        let span = lit.span();
        let before = errors.count();
        let segments = split(&text, &mut |message| errors.push_at(span, message));
        if text.trim().is_empty() {
            errors.push_at(
                span,
                "lock key must not be empty: write e.g. `key = \"order:<order_id>\"`",
            );
        }
        if text.len() > MAX_KEY_BYTES {
            errors.push_at(
                span,
                format!("lock key is {} bytes; the limit is {MAX_KEY_BYTES}", text.len()),
            );
        }
        for segment in &segments {
            if let Segment::Placeholder(path) = segment {
                check_root(path, params, span, errors);
            }
        }
        (errors.count() == before).then_some(Template { segments, span })
    }

    /// Whether the template names a parameter: a constant key in a set of
    /// keys would serialise every call.
    pub(crate) fn has_placeholder(&self) -> bool {
        self.segments.iter().any(|s| matches!(s, Segment::Placeholder(_)))
    }

    /// The template's span (its literal).
    pub(crate) fn span(&self) -> Span {
        self.span
    }

    /// An expression of type `String` that renders the key. Each placeholder
    /// is borrowed and passed through `key_part`, whose trait bound reports
    /// a non-`Display` type at the key literal in our words.
    pub(crate) fn render(&self) -> TokenStream {
        let mut format = String::new();
        let mut parts = Vec::new();
        for segment in &self.segments {
            match segment {
                Segment::Text(text) => format.push_str(&text.replace('{', "{{").replace('}', "}}")),
                Segment::Placeholder(path) => {
                    format.push_str("{}");
                    let root = match path[0].as_str() {
                        "self" => quote_spanned!(self.span=> self),
                        name => format_ident!("{}", name, span = self.span).into_token_stream(),
                    };
                    // Field names are marked as macro-made (the literal's
                    // place, mixed-site hygiene), so that rustc's "a field
                    // with a similar name exists" stays a hint: as a
                    // suggestion, it would replace the whole key literal.
                    let field_span = self.span.resolved_at(Span::mixed_site());
                    let fields = path[1..].iter().map(|f| match f.parse::<u32>() {
                        Ok(index) => syn::Index {
                            index,
                            span: field_span,
                        }
                        .into_token_stream(),
                        Err(_) => format_ident!("{}", f, span = field_span).into_token_stream(),
                    });
                    parts.push(quote_spanned! {self.span=>
                        ::lock_runtime::__private::key_part(&#root #(.#fields)*)
                    });
                }
            }
        }
        let format = LitStr::new(&format, self.span);
        quote! { ::lock_runtime::__private::format!(#format #(, #parts)*) }
    }
}

/// Splits the template text; `complain` gets each syntax problem.
fn split(text: &str, complain: &mut dyn FnMut(String)) -> Vec<Segment> {
    let mut segments = Vec::new();
    let mut literal = String::new();
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '<' if chars.peek().is_some_and(|&(_, n)| n == '<') => {
                chars.next();
                literal.push('<');
            }
            '>' if chars.peek().is_some_and(|&(_, n)| n == '>') => {
                chars.next();
                literal.push('>');
            }
            '<' => {
                let Some(len) = text[at + 1..].find('>') else {
                    complain(format!(
                        "unclosed `<` in key template `{text}`: close the placeholder with `>`, or write `<<` for a literal `<`"
                    ));
                    break;
                };
                let inner = &text[at + 1..at + 1 + len];
                for _ in 0..=len {
                    chars.next();
                }
                if let Some(path) = placeholder(inner, text, complain) {
                    if !literal.is_empty() {
                        segments.push(Segment::Text(std::mem::take(&mut literal)));
                    }
                    segments.push(Segment::Placeholder(path));
                }
            }
            '>' => complain(format!(
                "stray `>` in key template `{text}`: write `>>` for a literal `>`"
            )),
            '{' | '}' => complain(format!(
                "`{c}` in key template `{text}`: braces are reserved for the Redis Cluster hash tag the library adds"
            )),
            c if c.is_control() => complain(format!(
                "control character `{}` in key template: keys are names, write them without newlines or NULs",
                c.escape_default()
            )),
            c => literal.push(c),
        }
    }
    if !literal.is_empty() {
        segments.push(Segment::Text(literal));
    }
    segments
}

/// `name`, `name.field`, `self.field`, `pair.0` -> the path, or a complaint.
fn placeholder(inner: &str, text: &str, complain: &mut dyn FnMut(String)) -> Option<Vec<String>> {
    if inner.trim().is_empty() {
        complain(format!(
            "empty `<>` in key template `{text}`: name a parameter, e.g. `<order_id>`, or write `<<>>` for a literal `<>`"
        ));
        return None;
    }
    let path: Vec<String> = inner.split('.').map(str::to_owned).collect();
    let valid_root = is_identifier(&path[0]);
    let valid_fields = path[1..]
        .iter()
        .all(|f| is_identifier(f) || f.parse::<u32>().is_ok());
    if !valid_root || !valid_fields {
        complain(format!(
            "`<{inner}>` is not a placeholder: write a parameter name, optionally with fields, e.g. `<order_id>` or `<order.id>`; write `<<` for a literal `<`"
        ));
        return None;
    }
    if path[0] == "self" && path.len() == 1 {
        complain("`<self>` is not supported: name a field, e.g. `<self.id>`".to_owned());
        return None;
    }
    Some(path)
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
        && s != "_"
}

fn check_root(path: &[String], params: &Params, span: Span, errors: &mut Errors) {
    let root = path[0].as_str();
    if root == "self" {
        if !params.has_self {
            errors.push_at(
                span,
                "`<self...>` in key template, but this function has no `self` parameter",
            );
        }
        return;
    }
    if params.names.iter().any(|n| n == root) {
        return;
    }
    let names = params.names.iter().map(String::as_str);
    let message = if params.names.is_empty() {
        format!(
            "unknown parameter `{root}` in key template; `fn {}` has no parameters",
            params.fn_name
        )
    } else {
        let hint = closest(root, names.clone())
            .map(|c| format!("did you mean `{c}`? "))
            .unwrap_or_default();
        format!(
            "unknown parameter `{root}` in key template; {hint}parameters are {}",
            backticked(names)
        )
    };
    errors.push_at(span, message);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_ok(text: &str) -> Vec<Segment> {
        let mut problems = Vec::new();
        let segments = split(text, &mut |p| problems.push(p));
        assert!(problems.is_empty(), "{text}: {problems:?}");
        segments
    }

    fn problems(text: &str) -> Vec<String> {
        let mut problems = Vec::new();
        split(text, &mut |p| problems.push(p));
        problems
    }

    #[test]
    fn splits_text_and_placeholders() {
        use Segment::*;
        assert_eq!(
            split_ok("stock:<product_id>:<order.id>"),
            [
                Text("stock:".into()),
                Placeholder(vec!["product_id".into()]),
                Text(":".into()),
                Placeholder(vec!["order".into(), "id".into()]),
            ]
        );
        assert_eq!(split_ok("a<<b>>c"), [Text("a<b>c".into())]);
        assert_eq!(
            split_ok("<pair.0>"),
            [Placeholder(vec!["pair".into(), "0".into()])]
        );
        assert_eq!(
            split_ok("<<<x>>>"),
            [Text("<".into()), Placeholder(vec!["x".into()]), Text(">".into())]
        );
    }

    #[test]
    fn syntax_problems_say_what_to_write() {
        assert!(problems("a<b")[0].contains("unclosed `<`"));
        assert!(problems("a<>b")[0].contains("empty `<>`"));
        assert!(problems("a>b")[0].contains("`>>`"));
        assert!(problems("a{b")[0].contains("braces"));
        assert!(problems("a\nb")[0].contains("\\n"));
        assert!(problems("<a b>")[0].contains("not a placeholder"));
        assert!(problems("<self>")[0].contains("<self.id>"));
    }
}
