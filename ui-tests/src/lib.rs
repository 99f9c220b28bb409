//! Holds the trybuild ui tests of `#[distributed_lock]` under `tests/`.
