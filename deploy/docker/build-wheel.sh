#!/bin/sh
# Build stage of deploy/Dockerfile (also run by tests/deploy/test_deploy_manifests.py):
# the project's wheel, and the locked runtime dependencies (uv.lock, no dev group) as a
# hash-pinned requirements file, both into OUT.
#   usage: build-wheel.sh SOURCE_DIR OUT_DIR
set -eu
src=$1
out=$2
cd "$src"
uv build --wheel --out-dir "$out"
uv export --frozen --no-dev --no-emit-project --format requirements-txt -o "$out/requirements.txt"
