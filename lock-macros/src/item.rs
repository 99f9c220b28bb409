//! The annotated function: kept token for token, except its block.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::parse::{Parse, ParseStream};
use syn::visit::Visit;
use syn::{Attribute, Block, FnArg, Signature, Token, Visibility};

/// An `async fn` anywhere a fn can stand: free, inherent or trait impl, or a
/// trait declaration without a body (which the attribute refuses).
pub(crate) struct LockedFn {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    pub(crate) body: Option<Block>,
    semi: Option<Token![;]>,
}

impl Parse for LockedFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        let sig = input.parse()?;
        let (body, semi) = if input.peek(Token![;]) {
            (None, Some(input.parse()?))
        } else {
            (Some(input.parse()?), None)
        };
        Ok(LockedFn {
            attrs,
            vis,
            sig,
            body,
            semi,
        })
    }
}

impl ToTokens for LockedFn {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        tokens.extend(self.attrs.iter().map(ToTokens::to_token_stream));
        self.vis.to_tokens(tokens);
        self.sig.to_tokens(tokens);
        self.body.to_tokens(tokens);
        self.semi.to_tokens(tokens);
    }
}

/// The names a key template may start with.
#[derive(Debug)]
pub(crate) struct Params {
    pub(crate) fn_name: String,
    /// Every name the parameter patterns bind, destructured ones included.
    pub(crate) names: Vec<String>,
    pub(crate) has_self: bool,
}

impl Params {
    pub(crate) fn of(sig: &Signature) -> Params {
        let mut collector = Bindings(Vec::new());
        let mut has_self = false;
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(_) => has_self = true,
                FnArg::Typed(typed) => collector.visit_pat(&typed.pat),
            }
        }
        Params {
            fn_name: sig.ident.to_string(),
            names: collector.0,
            has_self,
        }
    }
}

struct Bindings(Vec<String>);

impl Visit<'_> for Bindings {
    fn visit_pat_ident(&mut self, pat: &syn::PatIdent) {
        self.0.push(pat.ident.to_string());
        syn::visit::visit_pat_ident(self, pat);
    }
}

/// Whether a type mentions `impl Trait`, which cannot annotate a `let`.
pub(crate) fn mentions_impl_trait(ty: &syn::Type) -> bool {
    struct Finder(bool);
    impl Visit<'_> for Finder {
        fn visit_type_impl_trait(&mut self, _: &syn::TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut finder = Finder(false);
    finder.visit_type(ty);
    finder.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_names_from_every_pattern() {
        let sig: Signature = syn::parse_quote! {
            async fn f(&self, a: u32, (b, mut c): (u8, u8), Point { x, y: why }: Point, [d, ..]: [u8; 4], _: ())
        };
        let params = Params::of(&sig);
        assert!(params.has_self);
        assert_eq!(params.names, ["a", "b", "c", "x", "why", "d"]);
    }
}
