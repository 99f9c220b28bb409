#!/usr/bin/env bash
# The README's test command: installs what the tests need when it is missing,
# then runs the whole workspace's tests with cargo-nextest (each test in a
# process of its own, tests of all binaries side by side; how many at once,
# and which run alone, is in .config/nextest.toml), the doctests first.
#
#   ./test.sh                  every test of tier 1 (NEXTEST_PROFILE=ci:
#                              tiers 1 and 2, as .ci/run runs them)
#   ./test.sh postgres         one backend's tests: redis, mysql, postgres,
#                              zookeeper, etcd or memory
#   ./test.sh s4pg             the tests whose name contains `s4pg` (one
#                              fault scenario), whichever tier; options
#                              (`--no-capture`, ...) go to `cargo nextest run`
#   ./test.sh --install-only   installs what is missing and stops
#
# The tests start their own servers on free loopback ports and stop them;
# they need the programs, not a running service:
#   - Debian packages `redis-server` and `redis-tools` (redis-server, redis-cli)
#     and `openssl` (the TLS test makes its certificates with it)
#   - the PyPI package `redis` (redis-py), whose `Lock` the interoperability
#     test holds a key with
#   - Debian package `mariadb-server` (mariadbd, mariadb-install-db): the
#     MySQL backend's tests start MariaDB in a fresh data directory
#   - Debian package `zookeeper` (its jars in /usr/share/java) and a Java
#     runtime: the ZooKeeper backend's tests start standalone servers and
#     3-node ensembles with `java -cp … ZooKeeperServerMain|QuorumPeerMain`
#   - Debian package `postgresql` (initdb, postgres, pg_isready, psql in
#     /usr/lib/postgresql/<major>/bin): the PostgreSQL tests start servers in
#     fresh data directories
#   - Debian package `etcd-server` (etcd), for the etcd backend's clusters
#   - Debian packages `protobuf-compiler` and `libprotobuf-dev` (protoc and
#     its well-known .proto files): the etcd driver `etcd-client` compiles
#     etcd's API definitions when it is built
set -euo pipefail
cd "$(dirname "$0")"

if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi

missing_debs=()
command -v redis-server >/dev/null 2>&1 || missing_debs+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing_debs+=(redis-tools)
command -v openssl >/dev/null 2>&1 || missing_debs+=(openssl)
# Debian installs mariadbd in /usr/sbin, which a user's PATH may lack.
if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
  missing_debs+=(mariadb-server)
fi
if [ ! -f /usr/share/java/zookeeper.jar ] || [ ! -f /usr/share/java/zookeeper-jute.jar ]; then
  missing_debs+=(zookeeper)
fi
command -v java >/dev/null 2>&1 || missing_debs+=(default-jre-headless)
if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  missing_debs+=(postgresql)
fi
command -v etcd >/dev/null 2>&1 || missing_debs+=(etcd-server)
command -v protoc >/dev/null 2>&1 || missing_debs+=(protobuf-compiler)
[ -f /usr/include/google/protobuf/descriptor.proto ] || missing_debs+=(libprotobuf-dev)
if [ "${#missing_debs[@]}" -gt 0 ]; then
  echo "--- installing ${missing_debs[*]} (Debian)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing_debs[@]}"
  # The package starts a system service on 6379; the tests never use it.
  $SUDO systemctl stop redis-server >/dev/null 2>&1 || $SUDO service redis-server stop >/dev/null 2>&1 || true
  # Likewise MariaDB's service on 3306.
  $SUDO systemctl stop mariadb >/dev/null 2>&1 || $SUDO service mariadb stop >/dev/null 2>&1 || true
  # And PostgreSQL's cluster on 5432, and etcd's member on 2379.
  $SUDO systemctl stop postgresql >/dev/null 2>&1 || $SUDO service postgresql stop >/dev/null 2>&1 || true
  $SUDO systemctl stop etcd >/dev/null 2>&1 || $SUDO service etcd stop >/dev/null 2>&1 || true
fi

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import redis' >/dev/null 2>&1; then
  echo "--- installing redis-py (PyPI)"
  "$PYTHON" -m pip install --quiet --disable-pip-version-check redis
fi

redis-server --version
java -cp /usr/share/java/zookeeper.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-nop.jar org.apache.zookeeper.Version 2>/dev/null | sed -n '1s/^/ZooKeeper /p' || echo "ZooKeeper jars present"
"$(command -v mariadbd || echo /usr/sbin/mariadbd)" --version
"$(compgen -G '/usr/lib/postgresql/*/bin/postgres' | sort -V | tail -1)" --version
# `sed -n 1p` reads to the end: `head -1` would close the pipe early, and
# under pipefail the writer's SIGPIPE (exit 141) would fail the command.
etcd --version | sed -n 1p
protoc --version
"$PYTHON" -c 'import redis; print("redis-py", redis.__version__)'

# The runner. A new machine of this project's kind has it; elsewhere it is
# built from crates.io (a few minutes, once). 0.9.91 brought the test
# priorities .config/nextest.toml sets.
nextest_ok() {
  local version
  version="$(cargo nextest --version 2>/dev/null | sed -n '1s/^cargo-nextest \([0-9.]*\).*/\1/p')"
  [ -n "$version" ] && [ "$(printf '%s\n0.9.91\n' "$version" | sort -V | sed -n 1p)" = "0.9.91" ]
}
if ! nextest_ok; then
  echo "--- installing cargo-nextest (crates.io)"
  cargo install --locked --quiet cargo-nextest@0.9.143
  nextest_ok
fi
cargo nextest --version | sed -n 1p

if [ "${1:-}" = "--install-only" ]; then
  exit 0
fi

# One backend's tests: a filter on the names of the tests (most are modules
# of the `servers` binary named after their backend, or, as in the kinds
# suite, with a module per backend; the fault scenarios end their ids in
# my, pg, zk or etcd) and of the attribute's binaries.
# Redis's tests are the rest (its Sentinel, Cluster and Redlock included),
# less the attribute's compile-fail suite.
mysql_tests='test(/mysql|mariadb/) | binary(/^mysql/) | test(/::s[0-9]+[a-z]*my_/)'
postgres_tests='test(/postgres/) | binary(/^postgres/) | test(/::s[0-9]+[a-z]*pg_/)'
zookeeper_tests='test(/zookeeper|ensemble/) | binary(/^zookeeper/) | test(/::s[0-9]+[a-z]*zk_/)'
etcd_tests='test(/etcd/) | binary(/^etcd/)'
memory_tests='test(/in_memory|in_process|::memory::/)'
filter=()
case "${1:-}" in
  redis) filter=(-E "not ($mysql_tests | $postgres_tests | $zookeeper_tests | $etcd_tests | $memory_tests | package(ui-tests))") ;;
  mysql | mariadb) filter=(-E "$mysql_tests") ;;
  postgres) filter=(-E "$postgres_tests") ;;
  zookeeper) filter=(-E "$zookeeper_tests") ;;
  etcd) filter=(-E "$etcd_tests") ;;
  memory) filter=(-E "$memory_tests") ;;
esac
# The fault scenarios write their records to target/reliability; the
# summary's last line counts this run's verdicts, and how many ran starved.
rm -rf target/reliability
status=0
everything=0
if [ "${#filter[@]}" -gt 0 ]; then
  # A named backend runs its tests whatever tier they are in.
  shift
  cargo nextest run --workspace --no-fail-fast --ignore-default-filter "${filter[@]}" "$@" || status=$?
elif [ "$#" -gt 0 ] && [ "${1#-}" = "$1" ]; then
  # So does a part of a test's name.
  cargo nextest run --workspace --no-fail-fast --ignore-default-filter "$@" || status=$?
else
  everything=1
  # Everything: the doctests (nextest does not run those; they compile the
  # README's and the docs' code blocks), then the tests. Everything is
  # built first, in one build: built for the doctests first, the runtime's
  # library was compiled alone and its tests after it (294 s on a clean
  # checkout, against 260 s). A build that fails is reported once, not
  # again by the doctests and the runner.
  if cargo nextest run --workspace --no-run; then
    cargo test --workspace --doc || status=$?
    cargo nextest run --workspace --no-fail-fast "$@" || status=$?
  else
    status=$?
  fi
fi
# A scenario that ran starved and could not be judged (INVALID) proved
# nothing: it fails the command, as a FAIL does, whatever was selected (a
# selection without fault scenarios has no verdicts to sum).
# (the runner built it with the tests; `cargo run` would build the test
# crate's dependencies once more, without the tests' features)
if [ "$everything" = 1 ] || compgen -G 'target/reliability/*.json' >/dev/null; then
  "${CARGO_TARGET_DIR:-target}/debug/reliability-summary" --last-line --strict || status=$?
fi
exit "$status"
