#!/usr/bin/env bash
# Installs what pip cannot: a JDK and Maven (Kafka's jars come from Maven Central) and
# redis-server. Only acts where something is missing; needs root and apt-get to install.
set -euo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need+=(maven)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if [ ${#need[@]} -eq 0 ]; then
  echo "system deps: java, mvn and redis-server found"
  exit 0
fi
echo "system deps: installing ${need[*]}"
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "error: missing ${need[*]}; install them (Debian/Ubuntu: sudo apt-get install -y ${need[*]}) and run again" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${need[@]}"
# a package install may start redis as a system service; clipstream starts its own
if command -v service >/dev/null 2>&1; then service redis-server stop >/dev/null 2>&1 || true; fi
