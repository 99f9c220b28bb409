//! Annotated functions under `clippy::pedantic` and `deny(warnings)`: the
//! expansion must not make a user's lint run fail. `.ci/run` runs clippy over
//! this file with `-D warnings`.
#![deny(warnings, clippy::pedantic)]

use std::sync::Arc;

use lock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
enum ShopError {
    Lock(LockError),
    OutOfStock,
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        ShopError::Lock(e)
    }
}

#[distributed_lock(key = "stock:<product_id>", ttl = "30s", wait = "5s")]
async fn deduct_stock(product_id: u64, qty: u32) -> Result<u32, ShopError> {
    if qty > 7 {
        return Err(ShopError::OutOfStock);
    }
    Ok(u32::try_from(product_id).map_err(|_| ShopError::OutOfStock)? - qty)
}

struct Shop {
    id: u64,
}

impl Shop {
    #[distributed_lock(key = "shop:<self.id>", renew = false, fencing = true)]
    async fn audit(self: Arc<Self>, note: String) -> Result<String, ShopError> {
        Ok(note)
    }
}

#[tokio::test]
async fn without_init_the_body_does_not_run() {
    let outcome = deduct_stock(42, 1).await;
    assert!(
        matches!(outcome, Err(ShopError::Lock(LockError::NotInitialized))),
        "{outcome:?}"
    );
    let outcome = Arc::new(Shop { id: 1 }).audit("n".into()).await;
    assert!(
        matches!(outcome, Err(ShopError::Lock(LockError::NotInitialized))),
        "{outcome:?}"
    );
}
