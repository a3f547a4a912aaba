#!/usr/bin/env bash
# Installs those of the named Debian packages that are not installed yet, with sudo when not
# root, and says which:
#   bash tools/apt_install.sh LABEL PACKAGE...
# (prints "LABEL: installing ..." when there is anything to install; silent otherwise).
set -euo pipefail
label=$1
shift
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -gt 0 ] || exit 0
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
echo "$label: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null
