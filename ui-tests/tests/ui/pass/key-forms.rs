use lock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
pub struct ShopError;

impl From<LockError> for ShopError {
    fn from(_: LockError) -> Self {
        ShopError
    }
}

#[distributed_lock(key = "a<<b>>c:<name>:<order.id>")]
async fn keyed(name: String, order: Order) -> Result<String, ShopError> {
    // The key was rendered before the body, so the body may move `name`.
    let owned: String = name;
    Ok(owned + &order.id.to_string())
}

pub struct Order {
    pub id: u64,
}

#[distributed_lock(key = "no-params")]
async fn constant() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = keyed("n".into(), Order { id: 1 });
    let _ = constant();
}
