//! Parse -> validate -> emit. On any error the user's function is emitted
//! unchanged beside the errors, so the rest of the crate still type-checks
//! and IDE features keep working.

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{LitStr, ReturnType};

use crate::args::{Args, Mode, OnBusy};
use crate::errors::Errors;
use crate::item::{LockedFn, Params, erase_impl_trait};
use crate::key::Template;

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let func: LockedFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(error) => {
            let mut out = error.to_compile_error();
            out.extend(item);
            return out;
        }
    };
    match locked(args, &func) {
        Ok(out) => out,
        Err(error) => {
            let mut out = error.to_compile_error();
            out.extend(func.into_token_stream());
            out
        }
    }
}

fn locked(args: TokenStream, func: &LockedFn) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let args = Args::parse(args, &mut errors);
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        errors.push_at(
            sig.fn_token.span,
            "`#[distributed_lock]` requires an `async fn`; with `#[tokio::test]` or `#[tokio::main]`, put `#[distributed_lock]` above it",
        );
    }
    if func.body.is_none() {
        errors.push_at(
            sig.ident.span(),
            "`#[distributed_lock]` needs a function body: put it on the method in the `impl`, not on the trait's declaration",
        );
    }
    let params = Params::of(sig);
    let template = args
        .key
        .as_ref()
        .and_then(|key| Template::parse(key, &params, &mut errors));
    let templates: Option<Vec<Template>> = args.keys.as_ref().and_then(|keys| {
        let parsed: Vec<Option<Template>> = keys.iter().map(|k| Template::parse(k, &params, &mut errors)).collect();
        for template in parsed.iter().flatten() {
            if !template.has_placeholder() {
                errors.push_at(
                    template.span(),
                    "a key of `keys` names no parameter, so every call would wait for the same lock; use `key = \"...\"` for a constant key, or name a parameter, e.g. `<id>`",
                );
            }
        }
        parsed.into_iter().collect()
    });
    errors.finish(())?;
    let Some(body) = &func.body else {
        unreachable!("a missing body was reported as an error");
    };
    // The rendered key (or keys), and the runtime entry point that takes it:
    // a skipping one checks that the return type can say "did not run".
    let skips = args.on_busy == Some(OnBusy::Skip);
    let (render, entry) = match (template, templates) {
        (Some(template), _) if skips => (template.render(), quote!(run_locked_or_skip)),
        (Some(template), _) => (template.render(), quote!(run_locked)),
        (None, Some(templates)) => {
            let rendered = templates.iter().map(Template::render);
            let entry = if skips {
                quote!(run_locked_all_or_skip)
            } else {
                quote!(run_locked_all)
            };
            (quote!(::lock_runtime::__private::vec![#(#rendered),*]), entry)
        }
        (None, None) => unreachable!("a missing key was reported as an error"),
    };

    let spec_ident = syn::Ident::new("LOCK_SPEC", Span::mixed_site());
    let key_ident = syn::Ident::new("lock_key", Span::mixed_site());
    let spec = spec(&args);
    // `impl Trait` cannot annotate a `let`: the fake return names it `_`.
    let (return_type, return_span) = match &sig.output {
        ReturnType::Default => (quote!(()), sig.paren_token.span.close()),
        ReturnType::Type(_, ty) => (erase_impl_trait(ty).to_token_stream(), ty.span()),
    };
    // Gives the async block the function's return type, so that `?` and
    // type errors in the body resolve against what the user wrote.
    let fake_return = quote_spanned! {return_span=>
            #[allow(
                unknown_lints,
                unreachable_code,
                clippy::diverging_sub_expression,
                clippy::empty_loop,
                clippy::let_unit_value,
                clippy::needless_return,
                clippy::unreachable,
                clippy::used_underscore_binding
            )]
            if false {
                let __lock_fake_return: #return_type = loop {};
                return __lock_fake_return;
            }
    };
    // The call is spanned at the return type: that is where a type that
    // cannot carry a `LockError` must be fixed.
    // The body's statements go straight into the async block: wrapped in
    // their own braces, a one-expression body (`{ Ok(id) }`) would draw an
    // `unused_braces` warning whose fix does not compile.
    let stmts = &body.stmts;
    let call = quote_spanned! {return_span=>
        ::lock_runtime::__private::#entry(&#spec_ident, #key_ident, async move {
            #fake_return
            #(#stmts)*
        })
        .await
    };

    // The new body keeps the user's braces (their spans): an item whose
    // tokens all come from the user is linted as the user's, so an unused
    // annotated fn still gets its `dead_code` warning.
    let mut block = Group::new(
        Delimiter::Brace,
        quote! {
            static #spec_ident: ::lock_runtime::__private::LockSpec = #spec;
            let #key_ident = #render;
            #call
        },
    );
    block.set_span(body.brace_token.span.join());
    let LockedFn { attrs, vis, .. } = func;
    Ok(quote! {
        #(#attrs)*
        #vis #sig #block
    })
}

fn spec(args: &Args) -> TokenStream {
    // The metrics' `lock` label: the key template as written, never the
    // rendered key (one series per template).
    let name = match (&args.key, &args.keys) {
        (Some(key), _) => key.value(),
        (None, Some(keys)) => keys.iter().map(LitStr::value).collect::<Vec<_>>().join(","),
        (None, None) => String::new(),
    };
    let mut spec = quote!(::lock_runtime::__private::LockSpec::DEFAULT.name(#name));
    let millis = |ms: u64| quote!(::core::time::Duration::from_millis(#ms));
    if let Some(ttl) = &args.ttl {
        let d = millis(ttl.millis);
        spec.extend(quote!(.ttl(#d)));
    }
    if let Some(wait) = &args.wait {
        let d = millis(wait.millis);
        spec.extend(quote!(.wait(#d)));
    }
    if let Some(renew) = args.renew {
        spec.extend(quote!(.renew(#renew)));
    }
    if let Some(fencing) = args.fencing {
        spec.extend(quote!(.fencing(#fencing)));
    }
    match args.mode {
        Some(Mode::Read) => spec.extend(quote!(.mode(::lock_runtime::LockMode::Read))),
        Some(Mode::Write) => spec.extend(quote!(.mode(::lock_runtime::LockMode::Write))),
        None => {}
    }
    if let Some(n) = args.permits {
        spec.extend(quote!(.permits(#n)));
    }
    if let Some(n) = args.segments {
        spec.extend(quote!(.segments(#n)));
    }
    if let Some(fair) = args.fair {
        spec.extend(quote!(.fair(#fair)));
    }
    if args.on_busy == Some(OnBusy::Skip) {
        spec.extend(quote!(.skip_when_busy(true)));
    }
    if let Some(hold) = &args.hold_at_least {
        let d = millis(hold.millis);
        spec.extend(quote!(.hold_at_least(#d)));
    }
    spec
}

/// Each shape's expansion, rendered with `prettyplease` and compared with
/// `snapshots/<shape>.snap`, so that any change to generated code shows up in
/// review. `UPDATE_SNAPSHOTS=1 cargo test -p lock-macros` rewrites them.
#[cfg(test)]
mod snapshots {
    use std::path::PathBuf;

    use proc_macro2::TokenStream;
    use quote::quote;

    fn check(shape: &str, args: TokenStream, item: TokenStream) {
        let expanded = super::expand(args, item);
        let file: syn::File = syn::parse2(expanded).expect("the expansion is valid Rust");
        let rendered = prettyplease::unparse(&file);
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("snapshots")
            .join(format!("{shape}.snap"));
        if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
            std::fs::write(&path, &rendered).expect("write snapshot");
            return;
        }
        let stored = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            stored == rendered,
            "expansion of `{shape}` changed; review it and run with UPDATE_SNAPSHOTS=1:\n{rendered}"
        );
    }

    #[test]
    fn design_example() {
        check(
            "design-example",
            quote!(key = "stock:<product_id>", ttl = "30s", wait = "5s"),
            quote! {
                async fn deduct_stock(product_id: u64, qty: u32) -> Result<u32, ShopError> {
                    let left = stock(product_id).await? - qty;
                    Ok(left)
                }
            },
        );
    }

    #[test]
    fn method_with_field_placeholder() {
        check(
            "method",
            quote!(
                key = "shop:<self.id>:<order.sku.0>",
                renew = false,
                fencing = true
            ),
            quote! {
                /// Documented.
                pub(crate) async fn sell(&mut self, order: Order) -> Result<(), ShopError> {
                    self.sold += order.qty;
                    Ok(())
                }
            },
        );
    }

    #[test]
    fn generic_with_where_clause() {
        check(
            "generic",
            quote!(key = "item:<id>"),
            quote! {
                async fn update<K, V>(id: K, value: V) -> Result<String, E>
                where
                    K: Display,
                    V: Into<String>,
                {
                    Ok(value.into())
                }
            },
        );
    }

    #[test]
    fn destructured_parameter_and_impl_trait_return() {
        check(
            "destructured",
            quote!(key = "order:<shop>:<id>"),
            quote! {
                async fn pay(Order { id, shop }: Order) -> Result<impl Display, E> {
                    Ok(id)
                }
            },
        );
    }

    #[test]
    fn lock_kinds() {
        check(
            "kinds",
            quote!(key = "report:<id>", mode = "read"),
            quote! {
                async fn report(id: u64) -> Result<u64, E> {
                    Ok(id)
                }
            },
        );
        check(
            "segments",
            quote!(key = "stock:<sku>", segments = 5, wait = "2s"),
            quote! {
                async fn sell(sku: u64) -> Result<u64, E> {
                    Ok(sku)
                }
            },
        );
    }

    #[test]
    fn hold_at_least() {
        check(
            "hold",
            quote!(
                key = "report:<tick>",
                ttl = "30s",
                on_busy = "skip",
                hold_at_least = "55m"
            ),
            quote! {
                async fn hourly_report(tick: Tick) -> Result<(), E> {
                    Ok(())
                }
            },
        );
    }

    #[test]
    fn skip_when_busy() {
        check(
            "skip",
            quote!(key = "report:<day>", ttl = "5m", on_busy = "skip"),
            quote! {
                async fn nightly_report(day: u32) -> Result<(), E> {
                    Ok(())
                }
            },
        );
    }

    #[test]
    fn several_keys() {
        check(
            "keys",
            quote!(keys = ["account:<from>", "account:<to>"], wait = "5s"),
            quote! {
                async fn transfer(from: u64, to: u64, cents: u64) -> Result<u64, E> {
                    Ok(cents)
                }
            },
        );
    }

    #[test]
    fn errors_keep_the_original_function() {
        check(
            "error-fallback",
            quote!(key = "stock:<produt_id>", tll = "30s"),
            quote! {
                async fn deduct_stock(product_id: u64) -> Result<u64, E> {
                    Ok(product_id)
                }
            },
        );
    }
}
