//! Every problem found in one compile, reported together.

/// Collects errors while parsing and validating go on, so the user sees all
/// of them at once instead of fixing one per build.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn push_at(&mut self, span: proc_macro2::Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    pub(crate) fn count(&self) -> usize {
        self.0.as_ref().map_or(0, |e| e.clone().into_iter().count())
    }

    /// `Ok` with `value` when nothing was pushed, else every error.
    pub(crate) fn finish<T>(self, value: T) -> syn::Result<T> {
        match self.0 {
            Some(error) => Err(error),
            None => Ok(value),
        }
    }
}

/// The closest candidate to `found`, if one is close enough to be the
/// intended spelling.
pub(crate) fn closest<'a>(found: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(found, c), c))
        .filter(|&(distance, c)| distance <= (c.len().max(found.len()) / 3).max(1))
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, c)| c)
}

/// `` `a`, `b`, `c` ``: for lists in messages.
pub(crate) fn backticked<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    items
        .into_iter()
        .map(|i| format!("`{i}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_only_near_misses() {
        let params = ["product_id", "qty"];
        assert_eq!(closest("produt_id", params), Some("product_id"));
        assert_eq!(closest("qyt", params), Some("qty"));
        assert_eq!(closest("customer", params), None);
        assert_eq!(
            closest("tll", ["key", "ttl", "wait", "renew", "fencing"]),
            Some("ttl")
        );
    }
}
