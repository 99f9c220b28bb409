//! W3: 16 tasks (and 4 processes of 4 tasks) increment one counter under
//! one lock: throughput and cross-task handoff.

use super::*;

/// W3: 16 tasks increment one counter under one lock (GET, then SET + 1).
/// Handoff = from the moment the holder starts its release to the moment
/// the next holder has the lock.
pub(crate) async fn w3_contended(url: &str) -> Result<Report, Error> {
    w3_on(
        LockClient::connect(url).await?,
        url,
        "W3 16 tasks x 1 key, increments",
    )
    .await
}

/// W3 with any client; the counter lives on the Redis at `data_url`.
pub(crate) async fn w3_on(
    locks: LockClient,
    data_url: &str,
    workload: &'static str,
) -> Result<Report, Error> {
    w3_with(locks, data_url, workload, |request| request).await
}

/// W3 with each request configured by `configure` (`.fair(true)`, say).
pub(crate) async fn w3_with(
    locks: LockClient,
    data_url: &str,
    workload: &'static str,
    configure: fn(lock_runtime::LockRequest<'_>) -> lock_runtime::LockRequest<'_>,
) -> Result<Report, Error> {
    w3_locker(
        Library {
            locks,
            configure,
            wait: Duration::from_secs(30),
        },
        data_url,
        workload,
    )
    .await
}

/// Something that takes and gives back a named lock, waiting for it: the
/// library, or a peer crate, for the shapes every one of them runs.
pub(crate) trait Locker: Clone + Send + Sync + 'static {
    type Guard: Send;
    fn take(&self, key: &str) -> impl Future<Output = Result<Self::Guard, Error>> + Send;
    fn give(&self, guard: Self::Guard) -> impl Future<Output = Result<(), Error>> + Send;
}

/// The library's lock, each request configured by `configure` and waiting
/// up to `wait`.
#[derive(Clone)]
pub(crate) struct Library {
    pub(crate) locks: LockClient,
    pub(crate) configure: fn(lock_runtime::LockRequest<'_>) -> lock_runtime::LockRequest<'_>,
    pub(crate) wait: Duration,
}

impl Locker for Library {
    type Guard = lock_runtime::LockGuard;

    async fn take(&self, key: &str) -> Result<Self::Guard, Error> {
        Ok((self.configure)(self.locks.lock(key))
            .wait(self.wait)
            .acquire()
            .await?)
    }

    async fn give(&self, guard: Self::Guard) -> Result<(), Error> {
        Ok(guard.release().await?)
    }
}

/// W3 with any [`Locker`]: 16 tasks increment one counter (on the Redis at
/// `data_url`) under the lock `w3`.
pub(crate) async fn w3_locker<L: Locker>(
    locker: L,
    data_url: &str,
    workload: &'static str,
) -> Result<Report, Error> {
    let mut data = raw_connection(data_url).await?;
    let _: () = data.set("w3:counter", 0).await?;
    // (release started, by which task); the next holder reads it.
    let last_release: Arc<std::sync::Mutex<Option<(Instant, usize)>>> = Arc::default();
    let start = Instant::now();
    let tasks: Vec<_> = (0..W3_TASKS)
        .map(|task| {
            let (locker, mut data, last_release) = (locker.clone(), data.clone(), Arc::clone(&last_release));
            tokio::spawn(async move {
                let (mut any, mut cross) = (Vec::new(), Vec::new());
                for _ in 0..W3_INCREMENTS {
                    let guard = locker.take("w3").await?;
                    let acquired = Instant::now();
                    if let Some((released, by)) = *last_release.lock().unwrap_or_else(|e| e.into_inner()) {
                        let handoff = acquired.saturating_duration_since(released);
                        any.push(handoff);
                        if by != task {
                            cross.push(handoff);
                        }
                    }
                    let value: u64 = data.get("w3:counter").await?;
                    let _: () = data.set("w3:counter", value + 1).await?;
                    *last_release.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), task));
                    locker.give(guard).await?;
                }
                Ok::<_, Error>((any, cross))
            })
        })
        .collect();
    let (mut any, mut cross) = (Vec::new(), Vec::new());
    for task in tasks {
        let (a, c) = task.await??;
        any.extend(a);
        cross.extend(c);
    }
    let elapsed = start.elapsed();
    let counter: u64 = data.get("w3:counter").await?;
    Ok(Report {
        workload,
        ops: W3_TASKS * W3_INCREMENTS,
        elapsed,
        latencies: any,
        extra: vec![
            ("cross_task_handoff_p50_us", percentile_us(&cross, 0.5)),
            ("cross_task_handoff_p99_us", percentile_us(&cross, 0.99)),
            ("cross_task_handoffs", cross.len() as f64),
            ("final_counter", counter as f64),
        ],
    })
}

/// W3 across 4 OS processes x 4 tasks (this binary re-executed), started
/// together; increments/s and the final counter.
pub(crate) async fn w3_processes(url: &str) -> Result<Report, Error> {
    const PROCESSES: usize = 4;
    const TASKS: usize = 4;
    let mut data = raw_connection(url).await?;
    let _: () = data.set("w3p:counter", 0).await?;
    let exe = std::env::current_exe()?;
    let increments = W3_TASKS * W3_INCREMENTS / (PROCESSES * TASKS);
    let mut children = Vec::new();
    for _ in 0..PROCESSES {
        let mut child = Command::new(&exe)
            .args(["--w3-worker", url, &TASKS.to_string(), &increments.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut ready = String::new();
        BufReader::new(child.stdout.as_mut().ok_or("no stdout")?).read_line(&mut ready)?;
        children.push(child);
    }
    let start = Instant::now();
    for child in &mut children {
        writeln!(child.stdin.as_mut().ok_or("no stdin")?, "go")?;
    }
    for child in children {
        if !child.wait_with_output()?.status.success() {
            return Err("a W3 worker process failed".into());
        }
    }
    let elapsed = start.elapsed();
    let counter: u64 = data.get("w3p:counter").await?;
    Ok(Report {
        workload: "W3 4 processes x 4 tasks x 1 key",
        ops: PROCESSES * TASKS * increments,
        elapsed,
        extra: vec![("final_counter", counter as f64)],
        ..Report::default()
    })
}

pub(crate) async fn w3_worker(url: &str, tasks: usize, increments: usize) -> Result<(), Error> {
    let locks = LockClient::connect(url).await?;
    let data = raw_connection(url).await?;
    println!("ready");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (locks, mut data) = (locks.clone(), data.clone());
            tokio::spawn(async move {
                for _ in 0..increments {
                    let guard = locks.lock("w3p").wait(Duration::from_secs(60)).acquire().await?;
                    let value: u64 = data.get("w3p:counter").await?;
                    let _: () = data.set("w3p:counter", value + 1).await?;
                    guard.release().await?;
                }
                Ok::<_, Error>(())
            })
        })
        .collect();
    for w in workers {
        w.await??;
    }
    Ok(())
}
