//! A Redis Cluster of masters with replicas, built with `redis-cli --cluster
//! create` on free ports.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::server::{LOCK_USER_CLUSTER_RULES, RedisServer, lock_user_arguments, tls_arguments};

/// A port that is free, and whose cluster bus port (+10000) is free too.
fn free_cluster_port() -> u16 {
    loop {
        let port = rand_port();
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}

fn rand_port() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    // 20000..50000 keeps the bus port below 65535 and away from the
    // ephemeral range the kernel hands out.
    20_000 + (RandomState::new().hash_one(Instant::now()) % 30_000) as u16
}

/// A Redis Cluster of masters with replicas, started on free ports and
/// stopped on drop.
#[derive(Debug)]
pub struct Cluster {
    /// Every node, masters first as `redis-cli --cluster create` assigned them.
    pub nodes: Vec<RedisServer>,
    /// Each node's TLS port, in the order of `nodes`, for a cluster
    /// started with [`start_tls`](Self::start_tls); else empty.
    pub tls_ports: Vec<u16>,
}

impl Cluster {
    /// `masters` masters with `replicas` replicas each, node timeout 1 s.
    pub fn start(masters: usize, replicas: usize) -> Cluster {
        Self::start_with(masters, replicas, &[], false, None)
    }

    /// [`start`](Self::start), every node with the ACL user
    /// [`LOCK_USER`](crate::LOCK_USER) granted only
    /// [`LOCK_USER_RULES`](crate::LOCK_USER_RULES) and
    /// [`LOCK_USER_CLUSTER_RULES`]; [`lock_user_urls`](Self::lock_user_urls)
    /// log in as it, and each node fails the test on drop if its ACL
    /// refused anything (as [`RedisServer::start_with_lock_user`]).
    pub fn start_with_lock_user(masters: usize, replicas: usize) -> Cluster {
        let user = lock_user_arguments(LOCK_USER_CLUSTER_RULES);
        let user: Vec<&str> = user.iter().map(String::as_str).collect();
        Self::start_with(masters, replicas, &user, true, None)
    }

    /// `masters` masters (no replicas) that require `password`
    /// (`--requirepass`); the harness's own connections authenticate, and
    /// [`urls_with_password`](Self::urls_with_password) carry it.
    pub fn start_with_password(masters: usize, password: &str) -> Cluster {
        Self::start_with(masters, 0, &["--requirepass", password], false, None)
    }

    /// `masters` masters (no replicas) that also serve TLS, with the
    /// server certificate of `certs` (from
    /// [`make_certificates`](crate::make_certificates)), their cluster bus
    /// over TLS (`tls-cluster yes`): a client connected over TLS is told
    /// each node's TLS port, a plain one its plain port, which the
    /// harness's probes keep using. [`tls_urls`](Self::tls_urls) are the
    /// seeds over TLS.
    pub fn start_tls(masters: usize, certs: &Path) -> Cluster {
        Self::start_with(masters, 0, &[], false, Some(certs))
    }

    fn start_with(
        masters: usize,
        replicas: usize,
        more: &[&str],
        audited: bool,
        tls: Option<&Path>,
    ) -> Cluster {
        let mut extra: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            "1000",
            "--cluster-config-file",
            "nodes.conf",
        ]
        .into_iter()
        .chain(more.iter().copied())
        .map(str::to_owned)
        .collect();
        if tls.is_some() {
            extra.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(str::to_owned));
        }
        let mut nodes = Vec::new();
        let mut tls_ports = Vec::new();
        for _ in 0..masters * (1 + replicas) {
            let mut arguments = extra.clone();
            if let Some(certs) = tls {
                // With the bus over TLS, its port is the TLS port's +10000.
                let tls_port = free_cluster_port();
                arguments.extend(tls_arguments(certs, tls_port));
                tls_ports.push(tls_port);
            }
            let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
            let node = RedisServer::start_on(free_cluster_port, &arguments);
            nodes.push(if audited { node.audited() } else { node });
        }
        let addresses: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        let mut create = Command::new("redis-cli");
        // Read from the environment, not an argument that `ps` would show.
        if let Some(at) = more.iter().position(|a| *a == "--requirepass") {
            create.env("REDISCLI_AUTH", more[at + 1]);
        }
        let output = create
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli (apt-get install redis-tools)");
        assert!(
            output.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = Cluster { nodes, tls_ports };
        cluster.wait_until_healthy(Duration::from_secs(30));
        cluster
    }

    /// Waits until every live node reports the cluster ok and knows every
    /// other node, and every replica has synced with its master: a replica
    /// that never synced refuses to take over when its master dies.
    pub fn wait_until_healthy(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let total = self.nodes.len();
        loop {
            let healthy = self.nodes.iter().filter(|n| n.is_running()).all(|node| {
                let Ok(mut conn) = node.sync_connection() else {
                    return false;
                };
                let Ok(info) = redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut conn) else {
                    return false;
                };
                let Ok(replication) = redis::cmd("INFO").arg("replication").query::<String>(&mut conn) else {
                    return false;
                };
                let synced =
                    replication.contains("role:master") || replication.contains("master_link_status:up");
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && info.contains(&format!("cluster_known_nodes:{total}"))
                    && synced
            });
            if healthy {
                return;
            }
            assert!(Instant::now() < deadline, "cluster not healthy after {timeout:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Seed URLs: every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Seed URLs with the password of a cluster started with
    /// [`start_with_password`](Self::start_with_password), percent-encoded.
    pub fn urls_with_password(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url_with_password).collect()
    }

    /// Seed URLs over TLS (`rediss://`) of a cluster started with
    /// [`start_tls`](Self::start_tls).
    pub fn tls_urls(&self) -> Vec<String> {
        self.tls_ports
            .iter()
            .map(|port| format!("rediss://127.0.0.1:{port}/"))
            .collect()
    }

    /// Seed URLs as the lock user of
    /// [`start_with_lock_user`](Self::start_with_lock_user).
    pub fn lock_user_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::lock_user_url).collect()
    }

    /// The index in `nodes` of the master that owns `key`'s slot, waiting up
    /// to 10 s for one (during a failover, none does).
    pub fn master_of(&self, key: &str) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(master) = self.current_master_of(key) {
                return master;
            }
            assert!(Instant::now() < deadline, "no master owns the slot of {key}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills (SIGKILL) the master that owns `key`'s slot and waits, up to
    /// `timeout`, until one of its replicas owns the slot; returns the
    /// killed node's index in `nodes` (to [`revive`](RedisServer::revive)).
    pub fn kill_master_of(&mut self, key: &str, timeout: Duration) -> usize {
        let master = self.master_of(key);
        self.nodes[master].kill();
        let deadline = Instant::now() + timeout;
        while self.master_of(key) == master {
            assert!(Instant::now() < deadline, "no replica promoted for {key}");
            std::thread::sleep(Duration::from_millis(20));
        }
        master
    }

    fn current_master_of(&self, key: &str) -> Option<usize> {
        let probe = self.nodes.iter().find(|n| n.is_running()).expect("a live node");
        let slot: i64 = probe.query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key));
        let nodes: String = probe.query(redis::cmd("CLUSTER").arg("NODES"));
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let owns = fields[8..].iter().any(|range| {
                let mut bounds = range.split('-').filter_map(|b| b.parse::<i64>().ok());
                match (bounds.next(), bounds.next()) {
                    (Some(lo), Some(hi)) => (lo..=hi).contains(&slot),
                    (Some(only), None) => only == slot,
                    _ => false,
                }
            });
            if owns {
                let port: u16 = fields[1]
                    .split(['@', ':'])
                    .nth(1)
                    .and_then(|p| p.parse().ok())
                    .expect("node address");
                return self.nodes.iter().position(|n| n.port() == port);
            }
        }
        None
    }

    /// The cluster node id of node `index`.
    pub fn node_id(&self, index: usize) -> String {
        self.nodes[index].query(redis::cmd("CLUSTER").arg("MYID"))
    }
}
