#!/usr/bin/env bash
# Creates (once) the Python environment the PyTorch example needs and prints
# its path. torch from the package registry is several GB, so the environment
# lives outside the checkout, keyed by the versions below, and is reused
# whenever it is present and complete.
#
#   VENV=$(examples/torch_ddp/venv.sh) && "$VENV/bin/python" -c 'import torch'
#
# NESTOR_PY_CACHE overrides where environments are kept (default ~/.cache/nestor);
# NESTOR_VENV_EXISTING=1 only prints an environment that exists (else fails).
set -euo pipefail
TORCH_VERSION=2.15.0
GRPCIO_VERSION=1.85.1
PROTOBUF_VERSION=7.36.2
NUMPY_VERSION=2.4.6
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"
pyver="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
cache="${NESTOR_PY_CACHE:-$HOME/.cache/nestor}"
venv="$cache/venv-torch$TORCH_VERSION-grpcio$GRPCIO_VERSION-protobuf$PROTOBUF_VERSION-py$pyver"
if [ ! -f "$venv/.complete" ]; then
    if [ -n "${NESTOR_VENV_EXISTING:-}" ]; then
        echo "no complete environment at $venv" >&2
        exit 1
    fi
    rm -rf "$venv"
    mkdir -p "$cache"
    "$python" -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
    "$venv/bin/python" -m pip install --quiet "torch==$TORCH_VERSION" "grpcio==$GRPCIO_VERSION" "protobuf==$PROTOBUF_VERSION" "numpy==$NUMPY_VERSION" setuptools wheel >&2
    touch "$venv/.complete"
fi
# The client is installed from the checkout every time (cheap, and always current).
"$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation "$repo/python" >&2
echo "$venv"
