#!/usr/bin/env bash
# Builds the documentation site (mkdocs-material; the Python API by
# mkdocstrings) into DEST (default target/site), with warnings as errors:
# a broken link, a missing page or a docstring griffe cannot read fails it.
# The tools come from a cached Python environment (tests/venv.sh).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-$repo/target/site}"
MKDOCS_VERSION=1.6.1
MATERIAL_VERSION=9.8.1
MKDOCSTRINGS_VERSION=1.0.8
MKDOCSTRINGS_PYTHON_VERSION=2.0.11
venv="$(bash "$repo/tests/venv.sh" "venv-docs-mkdocs$MKDOCS_VERSION-material$MATERIAL_VERSION-mkdocstrings$MKDOCSTRINGS_VERSION-python$MKDOCSTRINGS_PYTHON_VERSION" \
    "mkdocs==$MKDOCS_VERSION" "mkdocs-material==$MATERIAL_VERSION" "mkdocstrings==$MKDOCSTRINGS_VERSION" \
    "mkdocstrings-python==$MKDOCSTRINGS_PYTHON_VERSION")"
cd "$repo"
export NO_MKDOCS_2_WARNING=1
"$venv/bin/mkdocs" build --strict --config-file mkdocs.yml --site-dir "$dest"
