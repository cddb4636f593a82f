#!/usr/bin/env bash
# Installs what pip cannot: a JDK and Maven (Kafka's jars come from Maven Central),
# redis-server and chromium. Only acts where something is missing; needs root and apt-get to install.
set -euo pipefail
need=()
# a JDK, not only a JRE: the fault suite runs a Java source file (clipstream/testing/leaders.py)
{ command -v java && command -v javac; } >/dev/null 2>&1 || need+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || need+=(maven)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# the TLS tests make their certificates with it (the gateway's HTTPS, the secured broker)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# the dashboard's test and `make demo`'s screenshot drive a headless Chromium
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -eq 0 ]; then
  echo "system deps: java, javac, mvn, redis-server, openssl and chromium found"
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
