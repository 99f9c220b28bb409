//! `lockctl`: see which locks are held, by whom and for how long; free one
//! whose holder is stuck; watch them come and go. It connects like a
//! service's client does and reads through the library's own code
//! (`LockClient::admin`), so it shows exactly what the locks see.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use lock_runtime::{LockClient, LockError, LockHolder, LockInfo};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(
    name = "lockctl",
    version,
    about = "Inspect and operate lock-runtime's distributed locks"
)]
struct Cli {
    #[command(flatten)]
    target: Target,
    /// Print JSON lines instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

/// Where the locks live: like the service's client.
#[derive(Debug, Clone, Args)]
struct Target {
    /// One Redis node (`redis://[user:password@]host[:port][/db]`).
    #[arg(long, global = true, default_value = "redis://127.0.0.1:6379/", conflicts_with_all = ["cluster", "redlock", "sentinel", "postgres", "mysql", "etcd", "zookeeper"])]
    url: String,
    /// A Redis Cluster: one or more seed URLs (comma-separated or repeated).
    #[arg(long, global = true, value_delimiter = ',', conflicts_with_all = ["redlock", "sentinel", "postgres", "mysql", "etcd", "zookeeper"])]
    cluster: Vec<String>,
    /// A Redlock: every master's URL (comma-separated or repeated).
    #[arg(long, global = true, value_delimiter = ',', conflicts_with_all = ["sentinel", "postgres", "mysql", "etcd", "zookeeper"])]
    redlock: Vec<String>,
    /// A master found through Sentinel, as `NAME@URL,URL,...` (the master's
    /// name, then the sentinels' URLs).
    #[arg(long, global = true, conflicts_with_all = ["postgres", "mysql", "etcd", "zookeeper"])]
    sentinel: Option<String>,
    /// A PostgreSQL lock table's database
    /// (`postgres://user:password@host:port/database`).
    #[arg(long, global = true, conflicts_with_all = ["mysql", "etcd", "zookeeper"])]
    postgres: Option<String>,
    /// The PostgreSQL lock table's name, as the services' `postgres_table`.
    #[arg(
        long,
        global = true,
        default_value = "distributed_locks",
        requires = "postgres"
    )]
    postgres_table: String,
    /// A MySQL / MariaDB lock table's database
    /// (`mysql://user@host:port/database`, `?require_ssl=true` for TLS).
    #[arg(long, global = true, conflicts_with_all = ["etcd", "zookeeper"])]
    mysql: Option<String>,
    /// The MySQL lock table's name, as the services' `mysql_table`.
    #[arg(long, global = true, default_value = "distributed_locks", requires = "mysql")]
    mysql_table: String,
    /// An etcd cluster: one or more endpoints, `host:port`,
    /// `http://host:port` or `https://host:port` (comma-separated or
    /// repeated).
    #[arg(long, global = true, value_delimiter = ',', num_args = 1.., conflicts_with = "zookeeper")]
    etcd: Vec<String>,
    /// The key under which the services' etcd locks live, as their
    /// `etcd_root`.
    #[arg(long, global = true, default_value = "/distributed-locks", requires = "etcd")]
    etcd_root: String,
    /// The etcd user, as the services' `etcd_user`; its password comes
    /// from `--password-file` or `LOCKCTL_PASSWORD`.
    #[arg(long, global = true, value_name = "USER", requires = "etcd")]
    etcd_user: Option<String>,
    /// The certificate (PEM) lockctl shows an etcd cluster that asks
    /// clients for one (`--client-cert-auth`), with `--etcd-key`.
    #[arg(long, global = true, value_name = "FILE", requires_all = ["etcd", "etcd_key"])]
    etcd_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of `--etcd-cert`.
    #[arg(long, global = true, value_name = "FILE", requires = "etcd_cert")]
    etcd_key: Option<std::path::PathBuf>,
    /// A ZooKeeper ensemble: its connect string, `host:port,host:port`
    /// (`tcp+tls://host:port` for members served over TLS).
    #[arg(long, global = true, value_name = "CONNECT")]
    zookeeper: Option<String>,
    /// The node under which the services' ZooKeeper locks live, as their
    /// `zookeeper_root`.
    #[arg(
        long,
        global = true,
        default_value = "/distributed-locks",
        requires = "zookeeper"
    )]
    zookeeper_root: String,
    /// The ZooKeeper digest identity the services' lock nodes belong to, as
    /// their `zookeeper_digest`; its password comes from `--password-file`
    /// or `LOCKCTL_PASSWORD`.
    #[arg(long, global = true, value_name = "USER", requires = "zookeeper")]
    zookeeper_user: Option<String>,
    /// The certificate (PEM) lockctl shows a ZooKeeper TLS port that asks
    /// clients for one (`ssl.clientAuth=need`), with `--zookeeper-key`.
    #[arg(long, global = true, value_name = "FILE", requires_all = ["zookeeper", "zookeeper_key"])]
    zookeeper_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of `--zookeeper-cert`.
    #[arg(long, global = true, value_name = "FILE", requires = "zookeeper_cert")]
    zookeeper_key: Option<std::path::PathBuf>,
    /// The CA (PEM) that TLS servers are verified against instead of the
    /// system's roots (`rediss://`, `sslmode=require`, `require_ssl=true`,
    /// `https://` etcd endpoints, `tcp+tls://` ZooKeeper members), as the
    /// services' `tls_root_certificate`.
    #[arg(long, global = true, value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
    /// The key prefix the services use.
    #[arg(long, global = true, default_value = "lock:")]
    prefix: String,
    /// Read the password from FILE (its first line) and use it in every
    /// URL above, or as `--etcd-user`'s or `--zookeeper-user`'s: a
    /// password in an argument shows in `ps`. The variable
    /// `LOCKCTL_PASSWORD` does the same. Give the URLs without one.
    #[arg(long, global = true, value_name = "FILE")]
    password_file: Option<std::path::PathBuf>,
}

/// The variable that carries the servers' password, as `--password-file`.
const PASSWORD_VARIABLE: &str = "LOCKCTL_PASSWORD";

#[derive(Debug, Subcommand)]
enum Command {
    /// Every held lock (or those whose key matches PATTERN, a glob such as
    /// `stock:*`): key, kind, holder, time left, fencing counter, waiters.
    List {
        /// A glob over keys as services render them.
        pattern: Option<String>,
    },
    /// One lock in full (`KEY#i` for segment i of a segmented lock, `NAME
    /// (election)` for an election's term, as `list` shows it).
    Inspect {
        /// The lock's key as services render it.
        key: String,
    },
    /// Free a lock whatever holds it. Its holder learns it lost the lock at
    /// its next renewal and its body is cancelled; waiters are woken now.
    Unlock {
        /// The lock's key as services render it.
        key: String,
        /// Required: freeing another process's lock breaks its exclusion.
        #[arg(long)]
        force: bool,
    },
    /// Print acquisitions and releases as they happen, until interrupted.
    /// Locks are sampled every INTERVAL: one held for less may not show.
    Watch {
        /// A glob over keys as services render them.
        pattern: Option<String>,
        /// How often to look (`200ms`, `1s`).
        #[arg(long, default_value = "200ms", value_parser = parse_interval)]
        interval: Duration,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("lockctl: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, LockError> {
    if let Command::Unlock { key, force: false } = &cli.command {
        eprintln!(
            "lockctl: `unlock` frees a lock that another process holds, breaking its exclusion; \
             run `lockctl unlock {key} --force` to do it"
        );
        return Ok(ExitCode::from(2));
    }
    let client = connect(&cli.target).await?;
    let admin = client.admin();
    let out = Output {
        json: cli.json,
        sessions: cli.target.zookeeper.is_some(),
    };
    match cli.command {
        Command::List { pattern } => {
            let locks = admin.list(pattern.as_deref()).await?;
            out.list(&locks);
        }
        Command::Inspect { key } => {
            let locks = admin.inspect(&key).await?;
            out.inspect(&key, &locks);
        }
        Command::Unlock { key, .. } => {
            let freed = admin.force_unlock(&key).await?;
            out.unlocked(&key, freed);
        }
        Command::Watch { pattern, interval } => {
            watch(&client, pattern.as_deref(), interval, &out).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn connect(target: &Target) -> Result<LockClient, LockError> {
    let ca = target
        .tls_ca
        .as_deref()
        .map(|path| read_file("--tls-ca", path))
        .transpose()?;
    let builder = || {
        let builder = LockClient::builder().key_prefix(target.prefix.clone());
        match &ca {
            Some(ca) => builder.tls_root_certificate(ca.clone()),
            None => builder,
        }
    };
    let password = password(target)?;
    if !target.etcd.is_empty() {
        #[cfg(feature = "etcd")]
        {
            let endpoints: Vec<&str> = target.etcd.iter().map(String::as_str).collect();
            let mut builder = builder().etcd_root(target.etcd_root.clone());
            if let Some((user, password)) = user_and_password(target, "etcd", &target.etcd_user, password)? {
                builder = builder.etcd_user(user, password);
            }
            if let (Some(cert), Some(key)) = (&target.etcd_cert, &target.etcd_key) {
                builder = builder
                    .etcd_client_certificate(read_file("--etcd-cert", cert)?, read_file("--etcd-key", key)?);
            }
            return builder.etcd(&endpoints).await;
        }
        #[cfg(not(feature = "etcd"))]
        return Err(LockError::InvalidConfig {
            node: "--etcd".into(),
            reason: "this lockctl was built without its `etcd` feature".into(),
        });
    }
    if let Some(connect) = &target.zookeeper {
        let mut builder = builder().zookeeper_root(target.zookeeper_root.clone());
        if let Some((user, password)) =
            user_and_password(target, "zookeeper", &target.zookeeper_user, password)?
        {
            builder = builder.zookeeper_digest(user, password);
        }
        if let (Some(cert), Some(key)) = (&target.zookeeper_cert, &target.zookeeper_key) {
            builder = builder.zookeeper_client_certificate(
                read_file("--zookeeper-cert", cert)?,
                read_file("--zookeeper-key", key)?,
            );
        }
        return builder.zookeeper(connect).await;
    }
    let target = &match password {
        Some(password) => target.with_password(&password)?,
        None => target.clone(),
    };
    if let Some(url) = &target.postgres {
        builder()
            .postgres_table(target.postgres_table.clone())
            .postgres(url)
            .await
    } else if let Some(url) = &target.mysql {
        builder().mysql_table(target.mysql_table.clone()).mysql(url).await
    } else if !target.cluster.is_empty() {
        builder().cluster(&target.cluster).await
    } else if !target.redlock.is_empty() {
        builder().redlock(&target.redlock).await
    } else if let Some(sentinel) = &target.sentinel {
        let Some((name, urls)) = sentinel.split_once('@') else {
            return Err(LockError::InvalidConfig {
                node: "--sentinel".into(),
                reason: "--sentinel takes NAME@URL,URL,... (the master's name, then the sentinels)".into(),
            });
        };
        builder().sentinel(name, urls.split(',')).await
    } else {
        builder().connect(&target.url).await
    }
}

/// The user `--<backend>-user` names with the password given, if any.
fn user_and_password(
    target: &Target,
    backend: &str,
    user: &Option<String>,
    password: Option<String>,
) -> Result<Option<(String, String)>, LockError> {
    match (user, password) {
        (Some(user), Some(password)) => Ok(Some((user.clone(), password))),
        (Some(_), None) => Err(LockError::InvalidConfig {
            node: format!("--{backend}-user"),
            reason: format!("give the user's password with --password-file or {PASSWORD_VARIABLE}"),
        }),
        // `LOCKCTL_PASSWORD`, set for the URL targets, must not stop a run
        // without a user; a file given is an intent, and refused.
        (None, Some(_)) if target.password_file.is_some() => Err(LockError::InvalidConfig {
            node: "--password-file".into(),
            reason: format!("a {backend} password needs its user: give --{backend}-user"),
        }),
        (None, _) => Ok(None),
    }
}

/// The bytes of the file `path`, given as `option`.
fn read_file(option: &str, path: &std::path::Path) -> Result<Vec<u8>, LockError> {
    std::fs::read(path).map_err(|e| LockError::InvalidConfig {
        node: option.into(),
        reason: format!("cannot read `{}`: {e}", path.display()),
    })
}

/// The password from `--password-file` or `LOCKCTL_PASSWORD`, if given.
fn password(target: &Target) -> Result<Option<String>, LockError> {
    let invalid = |node: &str, reason: String| LockError::InvalidConfig {
        node: node.into(),
        reason,
    };
    if let Some(path) = &target.password_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            invalid(
                "--password-file",
                format!("cannot read `{}`: {e}", path.display()),
            )
        })?;
        let line = text.lines().next().unwrap_or_default();
        if line.is_empty() {
            return Err(invalid(
                "--password-file",
                format!("`{}` holds no password", path.display()),
            ));
        }
        return Ok(Some(line.to_owned()));
    }
    match std::env::var(PASSWORD_VARIABLE) {
        Ok(password) if !password.is_empty() => Ok(Some(password)),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(invalid(PASSWORD_VARIABLE, "the password is not UTF-8".into()))
        }
    }
}

impl Target {
    /// The same target with `password` in every URL.
    fn with_password(&self, password: &str) -> Result<Target, LockError> {
        let mut target = self.clone();
        let put = |url: &str| put_password(url, password);
        target.url = put(&target.url)?;
        target.cluster = target.cluster.iter().map(|u| put(u)).collect::<Result<_, _>>()?;
        target.redlock = target.redlock.iter().map(|u| put(u)).collect::<Result<_, _>>()?;
        if let Some(sentinel) = &target.sentinel
            && let Some((name, urls)) = sentinel.split_once('@')
        {
            let urls: Vec<String> = urls.split(',').map(put).collect::<Result<_, _>>()?;
            target.sentinel = Some(format!("{name}@{}", urls.join(",")));
        }
        if let Some(url) = &target.mysql {
            target.mysql = Some(put(url)?);
        }
        if let Some(url) = &target.postgres {
            target.postgres = Some(if url.contains("://") {
                put(url)?
            } else if url.split_whitespace().any(|word| word.starts_with("password")) {
                return Err(LockError::InvalidConfig {
                    node: "--postgres".into(),
                    reason: "the connection string holds a password already; give it in one place".into(),
                });
            } else {
                // A key-value string: a quoted value, `\` and `'` escaped.
                let quoted = password.replace('\\', "\\\\").replace('\'', "\\'");
                format!("{url} password='{quoted}'")
            });
        }
        Ok(target)
    }
}

/// `url` (given without a password) with `password`, percent-encoded, as
/// its password: in the userinfo, or as `pass=` for a Unix socket's URL.
fn put_password(url: &str, password: &str) -> Result<String, LockError> {
    // The URL is not quoted: it could hold a password after all.
    let invalid = |reason: &str| LockError::InvalidConfig {
        node: "a URL given with LOCKCTL_PASSWORD or --password-file".into(),
        reason: reason.into(),
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(invalid(
            "a password can only be put into a URL, `scheme://user@host...`",
        ));
    };
    let encoded = utf8_percent_encode(password, NON_ALPHANUMERIC);
    let already = "the URL holds a password already; give it in one place";
    if rest.starts_with('/') {
        if rest.contains("pass=") {
            return Err(invalid(already));
        }
        let separator = if rest.contains('?') { '&' } else { '?' };
        return Ok(format!("{scheme}://{rest}{separator}pass={encoded}"));
    }
    // The authority ends at the first `/`, `?` or `#`: without a password
    // in it, the URL's user name holds none of them.
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, host) = match authority.rsplit_once('@') {
        Some((userinfo, _)) if userinfo.contains(':') => return Err(invalid(already)),
        Some((user, host)) => (user, host),
        None => ("", authority),
    };
    Ok(format!("{scheme}://{user}:{encoded}@{host}{tail}"))
}

/// `200ms`, `2s`, `1m`: whole numbers only.
fn parse_interval(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration like `200ms` or `2s`"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        _ => return Err(format!("`{text}`: the unit must be ms, s or m")),
    };
    if d < Duration::from_millis(10) {
        return Err("the interval must be at least 10ms".into());
    }
    Ok(d)
}

/// Polls `list` and prints what changed: a lock (key, holder) seen for the
/// first time is `acquired` (or `held` in the first sample), one no longer
/// seen is `released`.
async fn watch(
    client: &LockClient,
    pattern: Option<&str>,
    interval: Duration,
    out: &Output,
) -> Result<(), LockError> {
    let admin = client.admin();
    let started = Instant::now();
    let mut seen: BTreeMap<(String, String, String), LockInfo> = BTreeMap::new();
    let mut first = true;
    loop {
        let mut now: BTreeMap<(String, String, String), LockInfo> = BTreeMap::new();
        for lock in admin.list(pattern).await? {
            for holder in &lock.holders {
                now.insert(
                    (lock.key.clone(), lock.node.clone(), holder.id.clone()),
                    lock.clone(),
                );
            }
        }
        let at = started.elapsed();
        for ((key, node, holder), lock) in &now {
            if !seen.contains_key(&(key.clone(), node.clone(), holder.clone())) {
                let event = if first { "held" } else { "acquired" };
                out.event(event, at, lock, holder);
            }
        }
        for ((key, node, holder), lock) in &seen {
            if !now.contains_key(&(key.clone(), node.clone(), holder.clone())) {
                out.event("released", at, lock, holder);
            }
        }
        if first {
            out.started(seen.len() + now.len(), interval);
        }
        seen = now;
        first = false;
        tokio::time::sleep(interval).await;
    }
}

struct Output {
    json: bool,
    /// ZooKeeper's: a holder's node has no time of its own to end, it
    /// lives as long as its session.
    sessions: bool,
}

impl Output {
    fn list(&self, locks: &[LockInfo]) {
        if self.json {
            for lock in locks {
                println!("{}", lock_json(lock));
            }
            return;
        }
        if locks.is_empty() {
            println!("no locks held");
            return;
        }
        let mut rows = vec![[
            "KEY".to_owned(),
            "KIND".to_owned(),
            "HOLDER".to_owned(),
            "TIME LEFT".to_owned(),
            "FENCE".to_owned(),
            "WAITERS".to_owned(),
            "NODE".to_owned(),
        ]];
        for lock in locks {
            let waiters = waiters_text(lock);
            let fence = lock.fence.map_or_else(|| "-".to_owned(), |f| f.to_string());
            if lock.holders.is_empty() {
                rows.push([
                    lock.key.clone(),
                    lock.kind.as_str().to_owned(),
                    "-".to_owned(),
                    "-".to_owned(),
                    fence.clone(),
                    waiters.clone(),
                    lock.node.clone(),
                ]);
            }
            for holder in &lock.holders {
                rows.push([
                    lock.key.clone(),
                    lock.kind.as_str().to_owned(),
                    holder_text(lock, holder),
                    self.time_left_text(holder.time_left),
                    fence.clone(),
                    waiters.clone(),
                    lock.node.clone(),
                ]);
            }
        }
        print_table(&rows);
    }

    fn inspect(&self, key: &str, locks: &[LockInfo]) {
        if self.json {
            let locks: Vec<Value> = locks.iter().map(lock_json).collect();
            println!(
                "{}",
                json!({"key": key, "held": !locks.is_empty(), "locks": locks})
            );
            return;
        }
        if locks.is_empty() {
            println!("{key}: not held");
            return;
        }
        for lock in locks {
            println!("key:      {}", lock.key);
            println!("node:     {}", lock.node);
            println!("kind:     {}", lock.kind.as_str());
            println!(
                "fence:    {}",
                lock.fence
                    .map_or_else(|| "none issued".to_owned(), |f| f.to_string())
            );
            println!("waiters:  {}", waiters_text(lock));
            if let Some(value) = &lock.value {
                println!("value:    {}", value.escape_debug());
            }
            if lock.holders.is_empty() {
                println!("holders:  none (a waiting writer's claim keeps the key)");
            }
            for holder in &lock.holders {
                println!(
                    "{:<9} {}  ({})",
                    format!("{}:", holder.role),
                    holder.id,
                    self.time_left_phrase(holder.time_left)
                );
            }
        }
    }

    fn unlocked(&self, key: &str, freed: usize) {
        if self.json {
            println!("{}", json!({"key": key, "freed": freed > 0, "nodes": freed}));
        } else if freed == 0 {
            println!("{key}: not held; nothing freed");
        } else {
            println!(
                "{key}: freed on {freed} node(s); its holder learns at its next renewal, and waiters were woken"
            );
        }
    }

    /// A holder's time left in a table's cell.
    fn time_left_text(&self, left: Option<Duration>) -> String {
        match left {
            Some(d) => format!("{:.1}s", d.as_secs_f64()),
            None if self.sessions => "session".to_owned(),
            None => "no expiry".to_owned(),
        }
    }

    /// A holder's time left in a sentence.
    fn time_left_phrase(&self, left: Option<Duration>) -> String {
        match left {
            Some(d) => format!("{:.1}s left", d.as_secs_f64()),
            None if self.sessions => "held while its session lives".to_owned(),
            None => "no expiry".to_owned(),
        }
    }

    /// The first sample is taken: from here on, changes are reported.
    fn started(&self, held: usize, interval: Duration) {
        if self.json {
            let every = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
            println!(
                "{}",
                json!({"event": "started", "held": held, "interval_ms": every})
            );
        } else {
            println!("watching: {held} held, sampled every {interval:?}");
        }
    }

    fn event(&self, event: &str, at: Duration, lock: &LockInfo, holder_id: &str) {
        let holder = lock.holders.iter().find(|h| h.id == holder_id);
        if self.json {
            println!(
                "{}",
                json!({
                    "event": event,
                    "at_ms": u64::try_from(at.as_millis()).unwrap_or(u64::MAX),
                    "key": lock.key,
                    "node": lock.node,
                    "kind": lock.kind.as_str(),
                    "holder": holder_id,
                    "time_left_ms": holder.and_then(|h| h.time_left).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                    "fence": lock.fence,
                })
            );
        } else {
            let left = holder.map_or_else(String::new, |h| {
                format!(" {}", self.time_left_phrase(h.time_left))
            });
            println!(
                "{:>8.3}s {event:<8} {} {holder_id}{left}",
                at.as_secs_f64(),
                lock.key
            );
        }
    }
}

fn lock_json(lock: &LockInfo) -> Value {
    let holders: Vec<Value> = lock
        .holders
        .iter()
        .map(|h| {
            json!({
                "id": h.id,
                "role": h.role,
                "time_left_ms": h.time_left.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            })
        })
        .collect();
    json!({
        "key": lock.key,
        "node": lock.node,
        "kind": lock.kind.as_str(),
        "holders": holders,
        "fence": lock.fence,
        "waiters": lock.waiters,
        "in_line": lock.in_line,
        "value": lock.value,
    })
}

fn holder_text(lock: &LockInfo, holder: &LockHolder) -> String {
    match (holder.role, &lock.value) {
        ("holder", _) => holder.id.clone(),
        ("leader", Some(value)) => format!("{} (leader: {})", holder.id, shortened(value)),
        (role, _) => format!("{} ({role})", holder.id),
    }
}

/// A leader's value in a table's cell: its first 40 characters, control
/// characters escaped (a value is whatever the leader proclaimed, and must
/// not break the table or reach the terminal as escape sequences).
fn shortened(value: &str) -> String {
    const SHOWN: usize = 40;
    let shown = match value.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{}…", &value[..end]),
        None => value.to_owned(),
    };
    shown.escape_debug().to_string()
}

fn waiters_text(lock: &LockInfo) -> String {
    match (lock.waiters, lock.in_line) {
        (_, n) if n > 0 => format!("{n} in line"),
        (true, _) => "yes".to_owned(),
        (false, _) => "no".to_owned(),
    }
}

fn print_table<const N: usize>(rows: &[[String; N]]) {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
}
