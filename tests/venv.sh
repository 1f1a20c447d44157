#!/usr/bin/env bash
# Creates (once) a Python environment with the packages given and prints its
# path. It lives outside the checkout, under NAME and the Python version,
# and is reused whenever it is present and complete; NAME carries the
# packages' versions, so new versions make a new environment.
#
#   VENV=$(tests/venv.sh NAME PACKAGE==VERSION...)
#
# NESTOR_PY_CACHE overrides where environments are kept (default ~/.cache/nestor).
set -euo pipefail
name="$1"
shift
python="${PYTHON:-python3}"
# A fresh Debian or Ubuntu machine may lack Python or its venv module: root installs them.
if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3 python3-venv; } >&2
fi
pyver="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
cache="${NESTOR_PY_CACHE:-$HOME/.cache/nestor}"
venv="$cache/$name-py$pyver"
if [ ! -f "$venv/.complete" ]; then
    # One creator at a time (tests may call this at once).
    mkdir -p "$cache"
    exec 9>"$cache/.$name.lock"
    flock 9
    if [ ! -f "$venv/.complete" ]; then
        rm -rf "$venv"
        "$python" -m venv "$venv" >&2
        "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
        "$venv/bin/python" -m pip install --quiet "$@" >&2
        touch "$venv/.complete"
    fi
fi
echo "$venv"
