#!/usr/bin/env bash
# Start the services the tests use, each on loopback, when it is not
# answering already: PostgreSQL (5432, database `test`, no password),
# Redis (6379), NATS with JetStream (4222), a single-node Apache Kafka
# broker (9092 for clients, 9093 for its KRaft controller) and an Apache
# Iggy server (8090 TCP, 3000 HTTP; QUIC and WebSocket off).
#
#   bash ci/services.sh [postgres|redis|nats|kafka|iggy|chromium ...]   (default: all)
#
# `chromium` is no server: Debian's headless browser (with a font) that the
# dashboard's browser tests drive through Playwright (tests marked
# `browser`); it is installed when missing, nothing is started.
#
# For each service: if its port answers, nothing is done. Otherwise the
# server is installed when missing (Debian packages: postgresql,
# redis-server, nats-server; Kafka's jars from Maven Central through
# ci/kafka/pom.xml; Iggy's server binary from ../shared/iggy, else an
# iggy-server on PATH or named by WAKUWAKU_IGGY_SERVER, with Debian's
# libhwloc15), started in the background, and waited for with a time
# limit. A service that does not come up is named in one line on stderr
# with the place of its log, and the script exits 1 after trying the rest.
# It is idempotent: a second run reuses what is installed and running.
#
# State (Kafka's jars, data folders, logs) lives in $WAKUWAKU_SERVICES_DIR,
# default .services/ in the repository (git ignores it). Servers started
# here keep running after the script ends. docs/services.md has the details.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${WAKUWAKU_SERVICES_DIR:-$ROOT/.services}
WAIT=${WAKUWAKU_SERVICES_WAIT:-60}          # seconds to wait for one server
KAFKA_HEAP=${WAKUWAKU_KAFKA_HEAP:-512m}
mkdir -p "$STATE"

say() { echo "services: $*"; }
fail() { echo "services: $*" >&2; return 1; }

# True when something accepts TCP connections on 127.0.0.1:$1.
answers() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# Wait up to $WAIT seconds for port $2 of service $1; on time-out name the
# log $3. A server started by spawn that has exited fails at once.
wait_for() {
  local name=$1 port=$2 log=$3 i
  for ((i = 0; i < WAIT * 4; i++)); do
    answers "$port" && return 0
    if [ -f "$log.pid" ] && ! kill -0 "$(cat "$log.pid")" 2>/dev/null; then
      fail "$name exited before it answered on 127.0.0.1:$port (log: $log)"
      return 1
    fi
    sleep 0.25
  done
  fail "$name did not answer on 127.0.0.1:$port within ${WAIT} s (log: $log)"
}

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

APT_UPDATED=0
# Install the Debian packages named that are missing; one `apt-get update` per run.
apt_install() {
  local missing=() p
  for p in "$@"; do installed "$p" || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    fail "cannot install ${missing[*]} here (needs root and apt-get); install them, then run make services"
    return 1
  fi
  say "installing ${missing[*]} from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  if [ $APT_UPDATED = 0 ]; then
    timeout 300 apt-get update -qq >"$STATE/apt.log" 2>&1 || {
      fail "apt-get update failed (log: $STATE/apt.log)"; return 1; }
    APT_UPDATED=1
  fi
  timeout 600 apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >>"$STATE/apt.log" 2>&1 || {
    fail "apt-get install ${missing[*]} failed (log: $STATE/apt.log)"; return 1; }
}

# Run a command in the background, detached from this shell and its
# terminal, with its output in a log file.
spawn() {
  local log=$1; shift
  setsid nohup "$@" >"$log" 2>&1 </dev/null &
  echo $! >"$log.pid"
}

start_postgres() {
  local log=/var/log/postgresql
  if ! answers 5432; then
    apt_install postgresql || return 1
    local version
    version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$version" ]; then
      version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
      pg_createcluster "$version" main >>"$STATE/postgres.log" 2>&1 || {
        fail "postgres: pg_createcluster $version main failed (log: $STATE/postgres.log)"; return 1; }
    fi
    log=/var/log/postgresql/postgresql-$version-main.log
    trust_loopback "/etc/postgresql/$version/main/pg_hba.conf"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start >>"$STATE/postgres.log" 2>&1
    wait_for postgres 5432 "$log" || return 1
  fi
  # The tests connect as postgres to database test without a password.
  if ! psql -h 127.0.0.1 -U postgres -d test -tAc 'SELECT 1' >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
      local version
      version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
      trust_loopback "/etc/postgresql/$version/main/pg_hba.conf"
      runuser -u postgres -- psql -qc 'SELECT pg_reload_conf()' >/dev/null 2>&1
      runuser -u postgres -- createdb test >/dev/null 2>&1
    fi
    psql -h 127.0.0.1 -U postgres -d test -tAc 'SELECT 1' >/dev/null 2>&1 || {
      fail "postgres answers on 127.0.0.1:5432 but database test is not usable as postgres without a password (log: $log)"; return 1; }
  fi
}

# Let loopback connections in without a password (a test machine's server,
# bound to loopback only). Idempotent: the lines carry a marker.
trust_loopback() {
  local hba=$1
  [ -f "$hba" ] || return 0
  grep -q 'wakuwaku-tests' "$hba" && return 0
  local tmp
  tmp=$(mktemp)
  { echo "host all all 127.0.0.1/32 trust  # wakuwaku-tests"
    echo "host all all ::1/128 trust       # wakuwaku-tests"
    cat "$hba"; } >"$tmp"
  cat "$tmp" >"$hba"
  rm -f "$tmp"
}

start_redis() {
  answers 6379 && return 0
  apt_install redis-server || return 1
  mkdir -p "$STATE/redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no \
    --dir "$STATE/redis" --logfile "$STATE/redis.log" --pidfile "$STATE/redis.log.pid" \
    >/dev/null 2>&1
  wait_for redis 6379 "$STATE/redis.log"
}

start_nats() {
  answers 4222 && return 0
  apt_install nats-server || return 1
  mkdir -p "$STATE/nats"
  spawn "$STATE/nats.log" nats-server -a 127.0.0.1 -p 4222 -js -sd "$STATE/nats"
  wait_for nats 4222 "$STATE/nats.log"
}

start_kafka() {
  command -v java >/dev/null || apt_install openjdk-17-jre-headless || return 1
  command -v mvn >/dev/null || apt_install maven || return 1
  local dir=$STATE/kafka
  local lib=$dir/lib log=$dir/kafka.log
  mkdir -p "$dir"
  # The jars: copied once, again when the pom changes. Also when a broker
  # already answers: the fault tests start brokers of their own from them.
  if [ ! -f "$lib/.complete" ] || [ "$ROOT/ci/kafka/pom.xml" -nt "$lib/.complete" ]; then
    say "fetching Apache Kafka's jars from Maven Central (ci/kafka/pom.xml)"
    rm -rf "$lib"
    timeout 600 mvn -q -B -f "$ROOT/ci/kafka/pom.xml" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$lib" >"$dir/mvn.log" 2>&1 || {
      fail "kafka: mvn dependency:copy-dependencies failed (log: $dir/mvn.log)"; return 1; }
    touch "$lib/.complete"
  fi
  answers 9092 && return 0
  sed "\$a log.dirs=$dir/data" "$ROOT/ci/kafka/server.properties" >"$dir/server.properties"
  local java=(java "-Xms128m" "-Xmx$KAFKA_HEAP" -XX:+UseG1GC -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$ROOT/ci/kafka/log4j2.properties" -cp "$lib/*")
  # Storage is formatted once, with a fresh cluster id.
  if [ ! -f "$dir/data/meta.properties" ]; then
    local cluster
    cluster=$("${java[@]}" kafka.tools.StorageTool random-uuid 2>>"$dir/format.log") &&
      "${java[@]}" kafka.tools.StorageTool format -t "$cluster" \
        -c "$dir/server.properties" >>"$dir/format.log" 2>&1 || {
      fail "kafka: kafka.tools.StorageTool format failed (log: $dir/format.log)"; return 1; }
  fi
  spawn "$log" "${java[@]}" kafka.Kafka "$dir/server.properties"
  WAIT=$((WAIT > 120 ? WAIT : 120)) wait_for kafka 9092 "$log"
}

# No registry ships an Iggy server: the one built from Apache's source for
# these machines (../shared/iggy, server 0.9.0-edge.5), else `iggy-server`
# on PATH or the file WAKUWAKU_IGGY_SERVER names. Copied into
# $STATE/iggy/, data in $STATE/iggy/data, root user iggy/iggy (read only
# when the data folder is new).
find_iggy() {
  local shared
  shared=$(cd "$ROOT/.." && pwd)/shared/iggy/iggy-server
  if [ -n "${WAKUWAKU_IGGY_SERVER:-}" ]; then
    command -v "$WAKUWAKU_IGGY_SERVER" 2>/dev/null || return 1
  elif [ -x "$shared" ]; then
    echo "$shared"
  else
    command -v iggy-server 2>/dev/null || return 1
  fi
}

start_iggy() {
  answers 8090 && return 0
  local dir=$STATE/iggy source
  source=$(find_iggy) || {
    local where="no Iggy server: none in ../shared/iggy, none on PATH (iggy-server), WAKUWAKU_IGGY_SERVER unset or not a file"
    if [ "${CI:-}" = true ]; then fail "iggy: $where"; return 1; fi
    say "iggy: $where; get server 0.9.0 from Apache's release (https://iggy.apache.org/) or its container image (apache/iggy), put iggy-server on PATH or set WAKUWAKU_IGGY_SERVER, then run make services"
    return 0
  }
  apt_install libhwloc15 || return 1
  mkdir -p "$dir/data"
  if ! cmp -s "$source" "$dir/iggy-server"; then
    cp "$source" "$dir/iggy-server.tmp" && chmod 755 "$dir/iggy-server.tmp" &&
      mv "$dir/iggy-server.tmp" "$dir/iggy-server" || {
      fail "iggy: cannot copy $source into $dir"; return 1; }
  fi
  # Its own default configuration when it comes with one (../shared/iggy
  # does); the binary embeds the same defaults otherwise.
  local config=()
  if [ -f "$(dirname "$source")/server.toml" ]; then
    cp "$(dirname "$source")/server.toml" "$dir/server.toml" && config=(IGGY_CONFIG_PATH="$dir/server.toml")
  fi
  spawn "$dir/iggy.log" env "${config[@]}" IGGY_SYSTEM_PATH="$dir/data" \
    IGGY_TCP_ADDRESS=127.0.0.1:8090 IGGY_HTTP_ADDRESS=127.0.0.1:3000 \
    IGGY_QUIC_ENABLED=false IGGY_WEBSOCKET_ENABLED=false \
    IGGY_ROOT_USERNAME=iggy IGGY_ROOT_PASSWORD=iggy "$dir/iggy-server"
  wait_for iggy 8090 "$dir/iggy.log"
}

# Debian's chromium for the browser tests (no server: installed when missing).
start_chromium() {
  command -v chromium >/dev/null && installed fonts-dejavu-core && return 0
  apt_install chromium fonts-dejavu-core || return 1
  command -v chromium >/dev/null || fail "chromium: installed but not on PATH (log: $STATE/apt.log)"
}

case ${1:-} in
  -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
services=()
for name in "$@"; do  # each service once, in the order given
  [[ " ${services[*]} " == *" $name "* ]] || services+=("$name")
done
[ ${#services[@]} -eq 0 ] && services=(postgres redis nats kafka iggy chromium)
status=0
for name in "${services[@]}"; do
  case $name in
    postgres | redis | nats | kafka | iggy | chromium) "start_$name" || status=1 ;;
    *) fail "unknown service '$name' (postgres, redis, nats, kafka, iggy, chromium)"; status=2 ;;
  esac
done
[ $status = 0 ] && say "up: ${services[*]}"
exit $status
