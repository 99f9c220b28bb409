//! More keys than one call may lock.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(keys = ["k0:<from>", "k1:<from>", "k2:<from>", "k3:<from>", "k4:<from>", "k5:<from>", "k6:<from>", "k7:<from>", "k8:<from>", "k9:<from>", "k10:<from>", "k11:<from>", "k12:<from>", "k13:<from>", "k14:<from>", "k15:<from>", "k16:<from>", "k17:<from>", "k18:<from>", "k19:<from>", "k20:<from>", "k21:<from>", "k22:<from>", "k23:<from>", "k24:<from>", "k25:<from>", "k26:<from>", "k27:<from>", "k28:<from>", "k29:<from>", "k30:<from>", "k31:<from>", "k32:<from>", "k33:<from>", "k34:<from>", "k35:<from>", "k36:<from>", "k37:<from>", "k38:<from>", "k39:<from>", "k40:<from>", "k41:<from>", "k42:<from>", "k43:<from>", "k44:<from>", "k45:<from>", "k46:<from>", "k47:<from>", "k48:<from>", "k49:<from>", "k50:<from>", "k51:<from>", "k52:<from>", "k53:<from>", "k54:<from>", "k55:<from>", "k56:<from>", "k57:<from>", "k58:<from>", "k59:<from>", "k60:<from>", "k61:<from>", "k62:<from>", "k63:<from>", "k64:<from>"])]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {}
