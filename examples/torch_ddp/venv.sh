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
# Installed into an existing environment when missing (no new environment for them).
CLOUDPICKLE_VERSION=3.1.2
PANDAS_VERSION=3.1.1
OPTUNA_VERSION=5.0.0
# The deep-learning frameworks on TorchTrainer (nestor's [huggingface] and [lightning] extras, and Accelerate).
TRANSFORMERS_VERSION=5.23.0
LIGHTNING_VERSION=2.6.6
ACCELERATE_VERSION=1.15.0
# nestor.data reads with Arrow (nestor's [data] extra); Hugging Face datasets feeds from_huggingface.
PYARROW_VERSION=26.0.1
HF_DATASETS_VERSION=5.2.0
# Images for nestor.data.read_images (Pillow decodes them, as in Ray Data).
PILLOW_VERSION=13.0.0
# Gradient-boosted trees (nestor's [xgboost] and [lightgbm] extras; scikit-learn ships their tests' data sets).
XGBOOST_VERSION=3.2.0
LIGHTGBM_VERSION=4.7.0
SKLEARN_VERSION=1.9.1
# Keras on TensorflowTrainer (nestor's [tensorflow] extra): TensorFlow's CPU build, and
# Keras 2 (tf_keras, without its dependency on the full build), which
# MultiWorkerMirroredStrategy's model.fit needs (TF_USE_LEGACY_KERAS=1, as in Ray).
TENSORFLOW_VERSION=2.21.0
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"
# CPython before 3.11.8 can hang a child forked while another thread holds
# the runtime's thread-list lock (gh-112275): a DataLoader's workers, forked
# from a rank whose gRPC threads are busy, can meet it. Unless PYTHON says
# otherwise, a default python3 without the fix gives way to a 3.12 or 3.13
# found on PATH or under pyenv.
fixed='import sys; v = sys.version_info[:3]; sys.exit(0 if v >= (3, 11, 8) else 1)'
if [ -z "${PYTHON:-}" ] && ! "$python" -c "$fixed" >/dev/null 2>&1; then
    pyenv_root="$(pyenv root 2>/dev/null || true)"
    for p in python3.12 python3.13 ${pyenv_root:+"$pyenv_root"/versions/3.12*/bin/python3.12 "$pyenv_root"/versions/3.13*/bin/python3.13}; do
        if "$p" -c "$fixed" >/dev/null 2>&1 && "$p" -c 'import venv, ensurepip, ssl' >/dev/null 2>&1; then
            python="$p"
            break
        fi
    done
fi
# A fresh Debian or Ubuntu machine may lack Python or its venv module: root installs them.
if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3 python3-venv; } >&2
fi
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
if [ ! -f "$venv/.complete-driver-$CLOUDPICKLE_VERSION-$PANDAS_VERSION-$OPTUNA_VERSION" ]; then
    "$venv/bin/python" -m pip install --quiet "cloudpickle==$CLOUDPICKLE_VERSION" "pandas==$PANDAS_VERSION" "optuna==$OPTUNA_VERSION" >&2
    touch "$venv/.complete-driver-$CLOUDPICKLE_VERSION-$PANDAS_VERSION-$OPTUNA_VERSION"
fi
frameworks="$venv/.complete-frameworks-$TRANSFORMERS_VERSION-$LIGHTNING_VERSION-$ACCELERATE_VERSION"
if [ ! -f "$frameworks" ]; then
    "$venv/bin/python" -m pip install --quiet "transformers==$TRANSFORMERS_VERSION" "lightning==$LIGHTNING_VERSION" "accelerate==$ACCELERATE_VERSION" >&2
    touch "$frameworks"
fi
if [ ! -f "$venv/.complete-data-$PYARROW_VERSION-$HF_DATASETS_VERSION" ]; then
    "$venv/bin/python" -m pip install --quiet "pyarrow==$PYARROW_VERSION" "datasets==$HF_DATASETS_VERSION" >&2
    touch "$venv/.complete-data-$PYARROW_VERSION-$HF_DATASETS_VERSION"
fi
if [ ! -f "$venv/.complete-pillow-$PILLOW_VERSION" ]; then
    "$venv/bin/python" -m pip install --quiet "pillow==$PILLOW_VERSION" >&2
    touch "$venv/.complete-pillow-$PILLOW_VERSION"
fi
trees="$venv/.complete-trees-$XGBOOST_VERSION-$LIGHTGBM_VERSION-$SKLEARN_VERSION"
if [ ! -f "$trees" ]; then
    "$venv/bin/python" -m pip install --quiet "xgboost-cpu==$XGBOOST_VERSION" "lightgbm==$LIGHTGBM_VERSION" "scikit-learn==$SKLEARN_VERSION" >&2
    touch "$trees"
fi
if [ ! -f "$venv/.complete-tensorflow-$TENSORFLOW_VERSION" ]; then
    "$venv/bin/python" -m pip install --quiet "tensorflow-cpu==$TENSORFLOW_VERSION" >&2
    "$venv/bin/python" -m pip install --quiet --no-deps "tf_keras==$TENSORFLOW_VERSION" >&2
    touch "$venv/.complete-tensorflow-$TENSORFLOW_VERSION"
fi
# The nestor package is this checkout's python/ (a path file: always current,
# nothing to build); the binary comes from NESTOR_BIN or PATH. `pip install
# ./python` is what users run: it builds the binary into the wheel.
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
if [ "$(cat "$site/nestor-checkout.pth" 2>/dev/null)" != "$repo/python" ]; then
    "$venv/bin/python" -m pip uninstall --quiet --yes nestor >/dev/null 2>&1 || true
    # Atomically: a Python starting meanwhile (another test) sees the old file or the new one.
    echo "$repo/python" > "$site/.nestor-checkout.pth.$$"
    mv "$site/.nestor-checkout.pth.$$" "$site/nestor-checkout.pth"
fi
echo "$venv"
