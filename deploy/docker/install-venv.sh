#!/bin/sh
# Runtime stage of deploy/Dockerfile (also run by tests/deploy/test_deploy_manifests.py):
# a fresh venv with the locked dependencies (every one pinned and hash-checked: an incomplete
# lock fails here), then the wheel itself without resolving anything more.
#   usage: install-venv.sh DIST_DIR VENV_DIR   (DIST_DIR as build-wheel.sh left it)
set -eu
dist=$1
venv=$2
python3 -m venv "$venv"
"$venv/bin/pip" install --require-hashes --no-deps -r "$dist/requirements.txt"
"$venv/bin/pip" install --no-deps "$dist"/prospero-*.whl
