#!/usr/bin/env bash
# Ray's own package, for the test that walks its public names
# (python/checks/ray_api.py reads its source; nothing of Ray is imported,
# so none of its dependencies are installed). Created once and cached
# (tests/venv.sh). Prints the environment's path.
#
#   VENV=$(tests/ray-venv.sh)
set -euo pipefail
RAY_VERSION=2.60.0
exec bash "$(dirname "$0")/venv.sh" "venv-ray$RAY_VERSION-source" --no-deps "ray==$RAY_VERSION"
