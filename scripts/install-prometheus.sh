#!/usr/bin/env bash
# Installs Debian's `prometheus` package for the tests (the server and promtool), without ever
# starting it: the package's postinst runs `invoke-rc.d prometheus start` (and enables the unit),
# which would leave a Prometheus holding port 9090. The tests start their own, on a free loopback
# port. A policy-rc.d that answers 101 ("action forbidden") keeps invoke-rc.d from starting it; the
# unit and the init script are then disabled, so a later boot does not start it either.
#
# Where it cannot install (not root, no apt-get) it says so and exits 0: the tests that need
# Prometheus skip with the same reason (tests/promtools.py also finds the binaries unpacked by
# scripts/validate-deploy.sh).
set -uo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
  exit 0
fi
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "prometheus not installed (needs root and apt-get): the Prometheus tests will skip"
  exit 0
fi

policy=/usr/sbin/policy-rc.d
saved=""
if [[ -e "$policy" ]]; then saved="$(mktemp)"; cp -p "$policy" "$saved"; fi
restore() { if [[ -n "$saved" ]]; then mv "$saved" "$policy"; else rm -f "$policy"; fi; }
trap restore EXIT
printf '#!/bin/sh\n# scripts/install-prometheus.sh: start no service while it installs\nexit 101\n' >"$policy"
chmod 0755 "$policy"

# --no-install-recommends: the recommended prometheus-node-exporter would start a service too.
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends prometheus >/dev/null; }; then
  echo "apt-get could not install prometheus: the Prometheus tests will skip"
  exit 0
fi
# The postinst enabled both the init script and the unit: disable them (systemctl works offline).
update-rc.d prometheus disable >/dev/null 2>&1 || true
deb-systemd-helper disable prometheus.service >/dev/null 2>&1 || true
systemctl disable prometheus.service >/dev/null 2>&1 || true
echo "installed $(prometheus --version 2>&1 | head -1) (not started, not enabled)"
