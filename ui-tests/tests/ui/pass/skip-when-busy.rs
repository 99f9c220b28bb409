//! `on_busy = "skip"` with each return shape it allows: `Result<(), E>`,
//! `Result<Option<T>, E>`, and the same through a `Result` alias (as
//! `anyhow::Result<()>` is one), on one key and on several; with a hold
//! after the body, on a tick's key.
use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct JobError;

impl From<LockError> for JobError {
    fn from(_: LockError) -> Self {
        JobError
    }
}

type Result<T, E = JobError> = std::result::Result<T, E>;

#[distributed_lock(key = "cleanup", ttl = "5m", on_busy = "skip")]
async fn hourly_cleanup() -> Result<()> {
    Ok(())
}

#[distributed_lock(key = "report:<day>", on_busy = "skip", wait = "2s")]
async fn nightly_report(day: u32) -> std::result::Result<Option<u64>, LockError> {
    Ok(Some(u64::from(day)))
}

#[distributed_lock(keys = ["account:<from>", "account:<to>"], on_busy = "skip")]
async fn settle(from: u64, to: u64) -> Result<Option<u64>> {
    Ok(Some(from + to))
}

#[distributed_lock(key = "report:<tick>", on_busy = "skip", hold_at_least = "55m", fencing = true)]
async fn hourly_report(tick: lock_runtime::Tick) -> Result<()> {
    let _ = tick;
    Ok(())
}

#[distributed_lock(key = "report:<day>", on_busy = "wait")]
async fn waiting_report(day: u32) -> Result<u64> {
    Ok(u64::from(day))
}

fn main() {
    let _ = (hourly_cleanup(), nightly_report(1), settle(1, 2), waiting_report(1));
    let _ = hourly_report(lock_runtime::Tick::now(std::time::Duration::from_secs(3600)));
}
