#!/usr/bin/env bash
# Set-up for a fresh Linux machine, idempotent: a second run only checks stamps (a few seconds).
#   - system tools: Java 17+, Maven, Python 3.11 with venv, Chromium + chromedriver, Prometheus, PostgreSQL (apt-get when missing)
#   - .venv from requirements.lock (uv), this project installed editable
#   - JVM jars resolved by Maven from jvm/*/pom.xml into .jvm/ (git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

apt_install() {
  log "installing system packages: $*"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

java_major() { java -version 2>&1 | sed -nE 's/.*version "([0-9]+).*/\1/p' | head -1; }
# A JDK, not just a JRE: the linkage test uses javap.
if ! command -v java >/dev/null || ! command -v javap >/dev/null || [ "$(java_major)" -lt 17 ]; then
  apt_install openjdk-17-jdk-headless
fi
if ! command -v mvn >/dev/null; then apt_install maven; fi
# Debian's Chromium and its WebDriver for the browser tests (tests/ui): nothing downloads a browser
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then apt_install chromium chromium-driver; fi
# Debian's Prometheus (the server and promtool): the monitoring tests scrape the platform and check its alert rules
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then apt_install --no-install-recommends prometheus; fi
# Debian's PostgreSQL server: Airflow's metadata as deployed (runtime/postgres.py, the production-shape tests)
if ! compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null; then apt_install --no-install-recommends postgresql; fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PY=$candidate; break
    fi
  done
fi
if [ -z "$PY" ]; then apt_install python3 python3-venv; PY=python3; fi

if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $($PY --version)"
  "$PY" -m venv .venv || { apt_install python3-venv; "$PY" -m venv .venv; }
fi

# Bytecode is compiled at install time: this machine sets PYTHONDONTWRITEBYTECODE, and uv does not
# compile by default, so every process would otherwise compile Airflow from source (8 s per import).
want=$( (cat requirements.lock pyproject.toml; echo compile-bytecode) | sha256sum | cut -c1-16)
if [ "$(cat .venv/.synced 2>/dev/null)" != "$want" ]; then
  log "installing Python dependencies from requirements.lock"
  .venv/bin/python -m pip install -q --disable-pip-version-check 'uv==0.13.9'
  .venv/bin/uv pip sync -q --compile-bytecode --python .venv/bin/python requirements.lock
  .venv/bin/uv pip install -q --python .venv/bin/python --no-deps -e .
  echo "$want" > .venv/.synced
fi

.venv/bin/python -m streamstate_cli setup-jvm
log "ready"
