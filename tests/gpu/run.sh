#!/usr/bin/env bash
# nestor's GPU acceptance run, in one command: builds the binary and the
# Python environment (examples/torch_ddp/venv.sh: torch with CUDA from the
# package registry, the frameworks; DeepSpeed where it installs), then runs
# tests/gpu/acceptance.py, which checks on the GPUs what only they can show
# and prints what each check measured:
#
#   bash tests/gpu/run.sh              # every check (about 5 minutes once the environment is cached)
#   bash tests/gpu/run.sh share ddp    # some of them
#   bash tests/gpu/run.sh --cpu        # the script itself, on a machine without a GPU
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
cargo build --release -p nestor-cli
venv="$(bash examples/torch_ddp/venv.sh)"
if [[ " $* " != *" --cpu "* ]] && ! "$venv/bin/python" -c 'import deepspeed' >/dev/null 2>&1; then
    "$venv/bin/python" -m pip install --quiet deepspeed >&2 || echo "deepspeed does not install here: its check is skipped" >&2
fi
export NESTOR_BIN="$repo/target/release/nestor" PATH="$venv/bin:$PATH"
exec "$venv/bin/python" tests/gpu/acceptance.py "$@"
