//! Redis behind its least-privilege ACL (#58): the rules docs/backends.md
//! gives operators are the ones the behaviour, kinds and election suites
//! run as (`LOCK_USER_RULES`, each server checking on drop that it refused
//! nothing), and a user missing any one grant is refused at start-up by an
//! error that names it, not at the first lock in production.

use lock_runtime::{LockClient, LockError};
use lock_tests::{
    Cluster, LOCK_USER, LOCK_USER_CLUSTER_RULES, LOCK_USER_REDLOCK_RULES, LOCK_USER_RULES,
    LOCK_USER_SENTINEL_MASTER_RULES, LOCK_USER_SENTINEL_RULES, RedisServer, Replicated,
};

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn the_documented_acl_is_the_one_the_tests_run_as() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/backends.md"))
        .expect("read docs/backends.md");
    let docs = one_line(&docs);
    for rules in [
        LOCK_USER_RULES,
        LOCK_USER_CLUSTER_RULES,
        LOCK_USER_SENTINEL_MASTER_RULES,
        LOCK_USER_SENTINEL_RULES,
    ] {
        assert!(
            docs.contains(&one_line(rules)),
            "docs/backends.md does not give the ACL the tests run as: {rules}"
        );
    }
}

/// Changes the lock user's ACL through the harness's default user.
fn set_user(server: &RedisServer, rules: &str) {
    let mut command = redis::cmd("ACL");
    command
        .arg("SETUSER")
        .arg(LOCK_USER)
        .arg(rules.split_whitespace().collect::<Vec<_>>());
    server.query::<()>(&mut command);
}

fn reason(started: Result<LockClient, LockError>) -> String {
    match started {
        Err(LockError::InvalidConfig { reason, .. }) => reason,
        Err(other) => panic!("a missing grant is a configuration error, got {other}"),
        Ok(_) => panic!("a client without a needed grant started"),
    }
}

async fn refusal(server: &RedisServer) -> String {
    reason(LockClient::connect(&server.lock_user_url()).await)
}

/// Named as a grant to add, or in the server's own refusal.
fn names(reason: &str, command: &str) -> bool {
    reason.contains(&format!("+{command}")) || reason.contains(&format!("'{command}'"))
}

/// The `+command` grants of `rules`.
fn grants(rules: &str) -> Vec<&str> {
    rules
        .split_whitespace()
        .filter_map(|rule| rule.strip_prefix('+'))
        .collect()
}

#[tokio::test]
async fn a_user_missing_a_grant_is_refused_at_start_up_by_name() {
    let server = RedisServer::start_with_lock_user("");
    LockClient::connect(&server.lock_user_url())
        .await
        .expect("the documented ACL is enough to start");
    let grants = grants(LOCK_USER_RULES);
    assert_eq!(grants.len(), 24, "every command of the documented ACL is tried");
    for command in grants {
        set_user(&server, &format!("-{command}"));
        let reason = refusal(&server).await;
        assert!(names(&reason, command), "without `{command}`: {reason}");
        set_user(&server, &format!("+{command}"));
    }
    for (narrowed, shown, restored) in [
        ("resetkeys ~other:*", "~lock:*", "resetkeys ~lock:*"),
        ("resetchannels &other:*", "&lock:*", "resetchannels &lock:*"),
    ] {
        set_user(&server, narrowed);
        let reason = refusal(&server).await;
        assert!(reason.contains(shown), "with `{narrowed}`: {reason}");
        set_user(&server, restored);
    }
    // A database other than 0 needs SELECT.
    let database_one = format!("{}1", server.lock_user_url());
    let reason = reason(LockClient::connect(&database_one).await);
    assert!(names(&reason, "select"), "database 1 without `select`: {reason}");
    set_user(&server, "+select");
    LockClient::connect(&database_one)
        .await
        .expect("with `select`, database 1");
    LockClient::connect(&server.lock_user_url())
        .await
        .expect("the ACL restored is enough again");
    // The refusals above were asked for: the server's drop must not count them.
    server.query::<()>(redis::cmd("ACL").arg("LOG").arg("RESET"));
}

#[tokio::test]
async fn a_cluster_user_missing_a_grant_is_refused_at_start_up_by_name() {
    let cluster = Cluster::start_with_lock_user(3, 0);
    let connect = || LockClient::cluster(cluster.lock_user_urls());
    connect()
        .await
        .expect("the documented cluster ACL is enough to start");
    for command in grants(LOCK_USER_CLUSTER_RULES) {
        // ACLs are each node's own: taken away on every node.
        for node in &cluster.nodes {
            set_user(node, &format!("-{command}"));
        }
        let reason = reason(connect().await);
        assert!(names(&reason, command), "without `{command}`: {reason}");
        for node in &cluster.nodes {
            set_user(node, &format!("+{command}"));
        }
    }
    connect().await.expect("the ACL restored is enough again");
    for node in &cluster.nodes {
        node.query::<()>(redis::cmd("ACL").arg("LOG").arg("RESET"));
    }
}

/// A Redlock asks each master: a grant taken away on one of them is
/// named at start-up.
#[tokio::test]
async fn a_redlock_user_missing_a_grant_on_one_master_is_refused_by_name() {
    let masters: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start_with_lock_user(LOCK_USER_REDLOCK_RULES))
        .collect();
    let urls: Vec<String> = masters.iter().map(RedisServer::lock_user_url).collect();
    let connect = || LockClient::redlock(&urls);
    connect()
        .await
        .expect("the documented Redlock ACL is enough to start");
    let last = &masters[2];
    for command in grants(LOCK_USER_RULES) {
        set_user(last, &format!("-{command}"));
        let reason = reason(connect().await);
        assert!(
            names(&reason, command),
            "without `{command}` on one master: {reason}"
        );
        set_user(last, &format!("+{command}"));
    }
    connect().await.expect("the ACL restored is enough again");
    for master in &masters {
        master.query::<()>(redis::cmd("ACL").arg("LOG").arg("RESET"));
    }
}

/// The redis crate confirms the master a Sentinel named with `ROLE`, or
/// with `INFO replication` where `ROLE` is refused: either grant lets the
/// client start and lock, and only a user refused both is stopped, by an
/// error naming `+role`.
#[tokio::test]
async fn a_sentinel_master_is_confirmed_with_role_or_info() {
    let group = Replicated::start_named_with_lock_user(0);
    // A wrong password is refused at once, as on one node, and not shown.
    let wrong: Vec<String> = group
        .lock_user_sentinel_urls()
        .iter()
        .map(|url| url.replacen("@", "-wrong@", 1))
        .collect();
    let started = std::time::Instant::now();
    let refused = LockClient::builder()
        .startup_timeout(std::time::Duration::from_secs(10))
        .sentinel(lock_tests::sentinel::MASTER_NAME, &wrong)
        .await;
    let took = started.elapsed();
    let shown = match &refused {
        Err(e) => format!("{e} {e:?}"),
        Ok(_) => panic!("a wrong password was let in"),
    };
    let wrong_password = reason(refused);
    assert!(
        wrong_password.contains("password"),
        "a wrong password: {wrong_password}"
    );
    assert!(
        took < std::time::Duration::from_secs(10),
        "waited {took:?} for a wrong password"
    );
    assert!(
        !shown.contains("lock-user-password"),
        "the password shown: {shown}"
    );
    group
        .master
        .query::<()>(redis::cmd("ACL").arg("LOG").arg("RESET"));
    let connect =
        || LockClient::builder().sentinel(lock_tests::sentinel::MASTER_NAME, group.lock_user_sentinel_urls());
    connect()
        .await
        .expect("the documented Sentinel ACL is enough to start");
    set_user(&group.master, "-role");
    let reason = reason(connect().await);
    assert!(names(&reason, "role"), "refused `role` and `info`: {reason}");
    set_user(&group.master, "+info");
    let locks = connect().await.expect("`info` stands in for `role`");
    locks
        .lock("acl:sentinel")
        .run(async {})
        .await
        .expect("a lock on the master INFO confirmed");
    // The crate's ROLE, refused on each new connection, was expected.
    group
        .master
        .query::<()>(redis::cmd("ACL").arg("LOG").arg("RESET"));
}
