//! The `#[distributed_lock]` attribute. Depend on `lock-runtime`, which
//! re-exports it; this crate is an implementation detail.

use proc_macro::TokenStream;

/// Runs the annotated `async fn`'s body with a distributed lock held.
#[proc_macro_attribute]
pub fn distributed_lock(_args: TokenStream, item: TokenStream) -> TokenStream {
    let mut out: proc_macro2::TokenStream = syn::Error::new(
        proc_macro2::Span::call_site(),
        "`#[distributed_lock]` is not implemented yet",
    )
    .to_compile_error();
    out.extend(proc_macro2::TokenStream::from(item));
    out.into()
}
