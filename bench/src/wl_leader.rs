//! WL: leader election's failover on every backend (#56). Per backend:
//! - from a leader's `resign` to the waiting candidate's election (two
//!   clients, the roles swapped every round), and how long after that an
//!   observer (a third client's `observe()`) shows the new leader;
//! - from a leader's crash (its process killed with SIGKILL while it leads)
//!   to the waiting candidate's election, against the bound the docs give:
//!   the lease plus one second (the election's ttl on Redis and the SQL
//!   stores, the session on ZooKeeper, the etcd lease on etcd; all three
//!   are `WL_LEASE` here), and how long after that the observer shows
//!   the successor.
//!
//! Redis is measured on one node, through Sentinel (a master, two
//! replicas, three sentinels) and on a Cluster of three masters.
//!
//! The crashed leader is this program run again as `--wl-candidate KIND
//! TARGET`: it campaigns, prints `elected EPOCH`, and leads until killed.

use std::collections::HashMap;
use std::sync::Mutex;

use lock_runtime::{Election, Leadership};

use super::*;

const WL_RESIGNS: usize = 50;
const WL_CRASHES: usize = 5;
/// Every backend's lease in this workload: the election's ttl, the
/// ZooKeeper session, the etcd lease. Short, so that crashes take seconds.
const WL_LEASE: Duration = Duration::from_secs(3);
/// How long a candidate is given to stand in line before the leader goes:
/// its first attempt must have reached the store, or the handover measured
/// would be an uncontended campaign.
const WL_SETTLE: Duration = Duration::from_millis(100);
const ELECTION: &str = "wl";

/// Where the elections are held.
#[derive(Clone)]
enum Store {
    InProcess,
    Redis(String),
    /// The master's name and the sentinels' URLs.
    Sentinel(String, Vec<String>),
    /// The seed URLs.
    Cluster(Vec<String>),
    MariaDb(String),
    Postgres(String),
    ZooKeeper(String),
    Etcd(Vec<String>),
}

impl Store {
    fn workload(&self) -> &'static str {
        match self {
            Store::InProcess => "WL in process: election failover",
            Store::Redis(_) => "WL Redis: election failover",
            Store::Sentinel(..) => "WL Redis Sentinel: election failover",
            Store::Cluster(_) => "WL Redis Cluster: election failover",
            Store::MariaDb(_) => "WL MariaDB: election failover",
            Store::Postgres(_) => "WL PostgreSQL: election failover",
            Store::ZooKeeper(_) => "WL ZooKeeper: election failover",
            Store::Etcd(_) => "WL etcd: election failover",
        }
    }

    /// The command-line arguments a candidate process takes (`None` in
    /// process: there is no other process to crash).
    fn args(&self) -> Option<[String; 2]> {
        let (kind, target) = match self {
            Store::InProcess => return None,
            Store::Redis(url) => ("redis", url.clone()),
            Store::Sentinel(name, urls) => ("sentinel", format!("{name}@{}", urls.join(","))),
            Store::Cluster(urls) => ("cluster", urls.join(",")),
            Store::MariaDb(url) => ("mysql", url.clone()),
            Store::Postgres(url) => ("postgres", url.clone()),
            Store::ZooKeeper(connect) => ("zookeeper", connect.clone()),
            Store::Etcd(endpoints) => ("etcd", endpoints.join(",")),
        };
        Some([kind.to_owned(), target])
    }

    fn parse(kind: &str, target: &str) -> Result<Store, Error> {
        Ok(match kind {
            "redis" => Store::Redis(target.to_owned()),
            "sentinel" => {
                let (name, urls) = target.split_once('@').ok_or("sentinel: NAME@URL,URL…")?;
                Store::Sentinel(name.to_owned(), urls.split(',').map(str::to_owned).collect())
            }
            "cluster" => Store::Cluster(target.split(',').map(str::to_owned).collect()),
            "mysql" => Store::MariaDb(target.to_owned()),
            "postgres" => Store::Postgres(target.to_owned()),
            "zookeeper" => Store::ZooKeeper(target.to_owned()),
            "etcd" => Store::Etcd(target.split(',').map(str::to_owned).collect()),
            other => return Err(format!("no store `{other}`").into()),
        })
    }

    async fn client(&self) -> Result<LockClient, Error> {
        let builder = LockClient::builder();
        Ok(match self {
            Store::InProcess => builder.in_memory()?,
            Store::Redis(url) => builder.connect(url).await?,
            Store::Sentinel(name, urls) => builder.sentinel(name, urls).await?,
            Store::Cluster(urls) => builder.cluster(urls).await?,
            Store::MariaDb(url) => builder.mysql(url).await?,
            Store::Postgres(url) => builder.postgres(url).await?,
            Store::ZooKeeper(connect) => {
                builder
                    .zookeeper_session_timeout(WL_LEASE)
                    .zookeeper(connect)
                    .await?
            }
            Store::Etcd(endpoints) => {
                let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
                builder.etcd_lease_ttl(WL_LEASE).etcd(&endpoints).await?
            }
        })
    }
}

fn election(locks: &LockClient) -> Election {
    locks.election(ELECTION).ttl(WL_LEASE)
}

/// `--wl-candidate KIND TARGET`: leads until this process is killed.
pub(crate) async fn wl_candidate(kind: &str, target: &str) -> Result<(), Error> {
    let locks = Store::parse(kind, target)?.client().await?;
    let leadership = election(&locks).campaign("crashes").await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "elected {}", leadership.epoch())?;
    out.flush()?;
    drop(out);
    leadership.lost().await;
    Err("the crashing candidate lost its term before it was killed".into())
}

/// Every WL workload: in process, and on each server the bench starts
/// (Redis is the bench's own, at `redis_url`).
pub(crate) async fn wl_leader(redis_url: &str) -> Result<Vec<Report>, Error> {
    let mut reports = vec![wl_on(Store::InProcess).await?];
    reports.push(wl_on(Store::Redis(redis_url.to_owned())).await?);
    let sentinel = tokio::task::block_in_place(|| lock_tests::Replicated::start_named(2));
    reports.push(
        wl_on(Store::Sentinel(
            lock_tests::sentinel::MASTER_NAME.to_owned(),
            sentinel.sentinel_urls(),
        ))
        .await?,
    );
    drop(sentinel);
    let cluster = tokio::task::block_in_place(|| lock_tests::Cluster::start(3, 0));
    reports.push(wl_on(Store::Cluster(cluster.urls())).await?);
    drop(cluster);
    let mariadb = tokio::task::block_in_place(lock_tests::MariaDb::start);
    reports.push(wl_on(Store::MariaDb(mariadb.url())).await?);
    drop(mariadb);
    let postgres = tokio::task::block_in_place(lock_tests::Postgres::start);
    reports.push(wl_on(Store::Postgres(postgres.url())).await?);
    drop(postgres);
    let zookeeper = tokio::task::block_in_place(lock_tests::ZooKeeper::start);
    reports.push(wl_on(Store::ZooKeeper(zookeeper.connect_string())).await?);
    drop(zookeeper);
    let etcd = tokio::task::block_in_place(lock_tests::Etcd::start);
    reports.push(wl_on(Store::Etcd(etcd.endpoints())).await?);
    drop(etcd);
    Ok(reports)
}

/// When the observer first showed each epoch.
type Seen = Arc<Mutex<HashMap<u64, Instant>>>;

async fn wl_on(store: Store) -> Result<Report, Error> {
    let (a, b, watcher) = match store {
        // One process: the candidates share its one client.
        Store::InProcess => {
            let locks = store.client().await?;
            (locks.clone(), locks.clone(), locks)
        }
        _ => (
            store.client().await?,
            store.client().await?,
            store.client().await?,
        ),
    };
    let seen = observe(&election(&watcher)).await?;
    let mut epochs = Vec::new();
    let mut observer_lags = Vec::new();
    let mut observers_missed = 0.0;

    let start = Instant::now();
    let mut resigns = Vec::with_capacity(WL_RESIGNS);
    let mut leading = election(&a).campaign("a").await?;
    epochs.push(leading.epoch());
    for round in 0..WL_RESIGNS {
        let next = if round % 2 == 0 { &b } else { &a };
        let candidate = campaign_timed(next, if round % 2 == 0 { "b" } else { "a" });
        tokio::time::sleep(WL_SETTLE).await;
        let resigned = Instant::now();
        leading.resign().await?;
        let (leadership, elected) = candidate.await??;
        resigns.push(elected.saturating_duration_since(resigned));
        epochs.push(leadership.epoch());
        match observed(&seen, leadership.epoch()).await {
            Some(at) => observer_lags.push(signed_ms(elected, at)),
            None => observers_missed += 1.0,
        }
        leading = leadership;
    }
    let elapsed = start.elapsed();
    leading.resign().await?;

    let mut crashes = Vec::new();
    let mut observer_lags_after_crashes = Vec::new();
    if let Some(args) = store.args() {
        for _ in 0..WL_CRASHES {
            let (crash, epoch, observer_lag) = crash_round(&args, &a, &seen).await?;
            crashes.push(crash);
            epochs.push(epoch);
            match observer_lag {
                Some(lag) => observer_lags_after_crashes.push(lag),
                None => observers_missed += 1.0,
            }
        }
    }

    let regressions = epochs.windows(2).filter(|w| w[1] <= w[0]).count();
    let mut extra = vec![
        ("lease_ms", millis_f64(WL_LEASE)),
        (
            "resign_to_elected_max_ms",
            resigns.iter().max().map_or(0.0, |d| millis_f64(*d)),
        ),
        ("observer_after_election_p50_ms", percentile(&observer_lags, 0.50)),
        ("observer_after_election_p99_ms", percentile(&observer_lags, 0.99)),
        ("observers_missed", observers_missed),
        ("epoch_regressions", regressions as f64),
    ];
    if !crashes.is_empty() {
        let crash_ms: Vec<f64> = crashes.iter().map(|d| millis_f64(*d)).collect();
        extra.push(("crash_to_elected_min_ms", percentile(&crash_ms, 0.0)));
        extra.push(("crash_to_elected_median_ms", percentile(&crash_ms, 0.5)));
        extra.push(("crash_to_elected_max_ms", percentile(&crash_ms, 1.0)));
        extra.push(("crash_bound_ms", millis_f64(WL_LEASE) + 1000.0));
        extra.push((
            "observer_after_crash_election_max_ms",
            percentile(&observer_lags_after_crashes, 1.0),
        ));
    }
    Ok(Report {
        workload: store.workload(),
        ops: WL_RESIGNS,
        elapsed,
        latencies: resigns,
        extra,
    })
}

/// A candidate campaigning on `locks`, and when it was elected.
fn campaign_timed(
    locks: &LockClient,
    value: &'static str,
) -> tokio::task::JoinHandle<Result<(Leadership, Instant), lock_runtime::LockError>> {
    let election = election(locks);
    tokio::spawn(async move {
        let leadership = election.campaign(value).await?;
        Ok((leadership, Instant::now()))
    })
}

/// One crash: a candidate process is elected, `follower` campaigns behind
/// it, the process is killed. Returns the time from the kill to the
/// follower's election, the follower's epoch, and how long after its
/// election the observer showed it (`None`: not within 10 s). The follower
/// resigns once the observer has shown it.
async fn crash_round(
    args: &[String; 2],
    follower: &LockClient,
    seen: &Seen,
) -> Result<(Duration, u64, Option<f64>), Error> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("--wl-candidate")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("the candidate's stdout")?;
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await??;
    if !line.starts_with("elected ") {
        let _ = child.kill();
        return Err(format!("the crashing candidate was not elected: {line:?}").into());
    }
    let candidate = campaign_timed(follower, "after a crash");
    tokio::time::sleep(WL_SETTLE).await;
    let killed = Instant::now();
    child.kill()?;
    tokio::task::spawn_blocking(move || child.wait()).await??;
    let (leadership, elected) = candidate.await??;
    let epoch = leadership.epoch();
    let observer_lag = observed(seen, epoch).await.map(|at| signed_ms(elected, at));
    leadership.resign().await?;
    Ok((elected.saturating_duration_since(killed), epoch, observer_lag))
}

/// An observer of `election`, recording when it first shows each epoch.
async fn observe(election: &Election) -> Result<Seen, Error> {
    let mut leaders = election.observe().await?;
    let seen: Seen = Arc::default();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let now = Instant::now();
            if let Some(leader) = leaders.borrow_and_update().as_ref() {
                record.lock().expect("seen").entry(leader.epoch).or_insert(now);
            }
            if leaders.changed().await.is_err() {
                return;
            }
        }
    });
    Ok(seen)
}

/// When the observer showed `epoch`, waiting up to 10 s for it.
async fn observed(seen: &Seen, epoch: u64) -> Option<Instant> {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(at) = seen.lock().expect("seen").get(&epoch) {
            return Some(*at);
        }
        if Instant::now() > give_up {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// `to - from` in milliseconds, negative when `to` came first (an observer
/// can show a leader before its `campaign` call has returned).
fn signed_ms(from: Instant, to: Instant) -> f64 {
    match to.checked_duration_since(from) {
        Some(after) => millis_f64(after),
        None => -millis_f64(from.duration_since(to)),
    }
}

fn millis_f64(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The `p` quantile of `figures`; 0 for none (a JSON line has no NaN).
fn percentile(figures: &[f64], p: f64) -> f64 {
    let mut sorted = figures.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        0.0
    } else {
        percentile_of(&sorted, p)
    }
}
