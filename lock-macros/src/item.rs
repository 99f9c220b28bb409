//! The annotated function: kept token for token, except its block.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::parse::{Parse, ParseStream};
use syn::visit::Visit;
use syn::visit_mut::VisitMut;
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

/// The type with every `impl Trait` replaced by `_`: `impl Trait` cannot
/// annotate a `let`, and `_` lets the compiler infer the same type from the
/// body, so the fake return keeps pointing type errors at the declared type.
pub(crate) fn erase_impl_trait(ty: &syn::Type) -> syn::Type {
    struct Eraser;
    impl VisitMut for Eraser {
        fn visit_type_mut(&mut self, ty: &mut syn::Type) {
            if let syn::Type::ImplTrait(impl_trait) = ty {
                let span = impl_trait.impl_token.span;
                *ty = syn::Type::Infer(syn::TypeInfer {
                    underscore_token: syn::Token![_](span),
                });
                return;
            }
            syn::visit_mut::visit_type_mut(self, ty);
        }
    }
    let mut erased = ty.clone();
    Eraser.visit_type_mut(&mut erased);
    erased
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
