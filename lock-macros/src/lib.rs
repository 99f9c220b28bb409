//! The `#[distributed_lock]` attribute. Depend on `lock-runtime`, which
//! re-exports it and documents it; this crate is an implementation detail.

mod args;
mod duration;
mod errors;
mod expand;
mod item;
mod key;

/// Runs the annotated `async fn`'s body with a distributed lock held.
///
/// Use it through `lock_runtime::distributed_lock`, whose documentation
/// describes every argument.
#[proc_macro_attribute]
pub fn distributed_lock(
    args: proc_macro::TokenStream,
    item: proc_macro::TokenStream,
) -> proc_macro::TokenStream {
    expand::expand(args.into(), item.into()).into()
}
