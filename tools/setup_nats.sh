#!/usr/bin/env bash
# Installs what the NATS driver (drivers/nats) and its tests need on Debian 12: cnats, the NATS
# maintainers' C client (libnats-dev 3.4.1), and nats-server, built from the Go module
# github.com/nats-io/nats-server/v2 into /usr/local/bin (the tests start it, tests/testing/
# nats_server.h). Idempotent: returns at once when both are present.
set -euo pipefail
here=$(dirname "$0")
nats_version=v2.15.3
nats_bin=/usr/local/bin

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

bash "$here/apt_install.sh" setup_nats libnats-dev pkg-config

[ -x /usr/local/go/bin/go ] && export PATH="$PATH:/usr/local/go/bin"
if "$nats_bin/nats-server" --version 2>/dev/null | grep -q "${nats_version}$"; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  bash "$here/apt_install.sh" setup_nats golang-go
fi
echo "setup: building nats-server ${nats_version}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A throwaway module, as for nsqd in setup_tests.sh: the build uses the versions nats-server's
# own go.mod pins.
cat >"$work/go.mod" <<MOD
module msgbus.local/natstools

go 1.24

require github.com/nats-io/nats-server/v2 ${nats_version}
MOD
(
  cd "$work"
  export GOFLAGS=-mod=mod GOTOOLCHAIN=local
  go get github.com/nats-io/nats-server/v2@${nats_version} >/dev/null 2>&1
  go build -o nats-server github.com/nats-io/nats-server/v2
)
"${sudo_cmd[@]}" install -m 0755 "$work/nats-server" "$nats_bin/nats-server"
