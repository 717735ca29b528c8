#!/usr/bin/env bash
# Installs the Debian packages the tests need (a real nginx with the lua
# module for the data-plane tests; luajit and lua-busted for the engine's
# lua unit specs and lua-check (luacheck) for their lint, make lua-test; luajit2 is OpenResty's LuaJIT, the one
# Debian's lua module links, and it conflicts with Debian's luajit). Idempotent; needs root (CI runs as root).
set -euo pipefail
pkgs=(nginx libnginx-mod-http-lua lua-cjson luajit2 lua-busted lua-check)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install-deps: need root to install: ${missing[*]} (or install them yourself)" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian enables a system nginx service; the tests run their own masters.
