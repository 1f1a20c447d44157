#!/usr/bin/env bash
# The Python environment the logger tests read back with: TensorBoard's own
# event reader, an MLflow tracking server, and W&B's offline mode, created
# once and cached (tests/venv.sh). Prints its path.
#
#   VENV=$(tests/loggers-venv.sh) && "$VENV/bin/python" -c 'import tensorboard'
set -euo pipefail
TENSORBOARD_VERSION=2.21.0
MLFLOW_VERSION=3.17.2
WANDB_VERSION=0.31.0
exec bash "$(dirname "$0")/venv.sh" "venv-loggers-tb$TENSORBOARD_VERSION-mlflow$MLFLOW_VERSION-wandb$WANDB_VERSION" \
    "tensorboard==$TENSORBOARD_VERSION" "mlflow==$MLFLOW_VERSION" "wandb==$WANDB_VERSION"
