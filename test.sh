#!/usr/bin/env bash
# The README's test command: installs what the tests need when it is missing,
# then runs the whole workspace's tests. Extra arguments go to `cargo test`;
# `--install-only` installs and stops.
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

if [ "${1:-}" = "--install-only" ]; then
  exit 0
fi
exec cargo test --workspace "$@"
