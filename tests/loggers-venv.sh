#!/usr/bin/env bash
# Creates (once) the Python environment the logger tests read back with:
# TensorBoard's own event reader, an MLflow tracking server, and W&B's
# offline mode. It lives outside the checkout, keyed by the versions below,
# and is reused whenever it is present and complete. Prints its path.
#
#   VENV=$(tests/loggers-venv.sh) && "$VENV/bin/python" -c 'import tensorboard'
#
# NESTOR_PY_CACHE overrides where environments are kept (default ~/.cache/nestor).
set -euo pipefail
TENSORBOARD_VERSION=2.21.0
MLFLOW_VERSION=3.17.2
WANDB_VERSION=0.31.0
python="${PYTHON:-python3}"
# A fresh Debian or Ubuntu machine may lack Python or its venv module: root installs them.
if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3 python3-venv; } >&2
fi
pyver="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
cache="${NESTOR_PY_CACHE:-$HOME/.cache/nestor}"
venv="$cache/venv-loggers-tb$TENSORBOARD_VERSION-mlflow$MLFLOW_VERSION-wandb$WANDB_VERSION-py$pyver"
if [ ! -f "$venv/.complete" ]; then
    # One creator at a time (tests may call this at once).
    mkdir -p "$cache"
    exec 9>"$cache/.loggers-venv.lock"
    flock 9
    if [ ! -f "$venv/.complete" ]; then
        rm -rf "$venv"
        "$python" -m venv "$venv" >&2
        "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
        "$venv/bin/python" -m pip install --quiet "tensorboard==$TENSORBOARD_VERSION" "mlflow==$MLFLOW_VERSION" "wandb==$WANDB_VERSION" >&2
        touch "$venv/.complete"
    fi
fi
echo "$venv"
