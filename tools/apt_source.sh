#!/usr/bin/env bash
# Unpacks Debian source packages (with Debian's patches) into a folder:
#   bash tools/apt_source.sh DEST abseil=20220623.1-1+deb12u2 googletest=1.12.1-0.2
# Source packages come from the same mirror as the binary ones: when apt cannot list a wanted
# version, each deb entry is repeated as a deb-src entry (deb822 .sources on Debian 12 images,
# else the one-line sources.list) and the lists are updated. Needs dpkg-dev (apt-get source
# unpacks with dpkg-source) and the network to Debian's mirror.
set -euo pipefail
dest=$1
shift
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

bash "$(dirname "$0")/apt_install.sh" apt_source dpkg-dev
listed() {
  local want
  for want in "$@"; do
    apt-cache showsrc "${want%%=*}" 2>/dev/null | grep -qx "Version: ${want#*=}" || return 1
  done
}
if ! listed "$@"; then
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    src_list=/etc/apt/sources.list.d/debian-src.sources
    [ -f "$src_list" ] || sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources |
      "${sudo_cmd[@]}" tee "$src_list" >/dev/null
  else
    src_list=/etc/apt/sources.list.d/debian-src.list
    [ -f "$src_list" ] || sed -n 's/^deb /deb-src /p' /etc/apt/sources.list |
      "${sudo_cmd[@]}" tee "$src_list" >/dev/null
  fi
  echo "apt_source: deb-src entries in $src_list"
  "${sudo_cmd[@]}" apt-get update -qq
fi
mkdir -p "$dest"
(cd "$dest" && apt-get source -qq "$@" >/dev/null 2>&1) || {
  echo "apt_source: apt-get source $* failed" >&2
  exit 1
}
