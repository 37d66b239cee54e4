#!/bin/sh
# Runtime stage of deploy/Dockerfile (also run by tests/deploy/test_deploy_manifests.py):
# a fresh venv with the locked dependencies (every one pinned and hash-checked: an incomplete
# lock fails here), then the wheel itself without resolving anything more. uv installs them
# (the image mounts it for this step only; it is not left in the image), with bytecode
# compiled now so that nothing is written next to the code at run time.
#   usage: install-venv.sh DIST_DIR VENV_DIR   (DIST_DIR as build-wheel.sh left it)
set -eu
dist=$1
venv=$2
python3 -m venv --without-pip "$venv"
uv pip install --python "$venv/bin/python" --compile-bytecode --require-hashes --no-deps \
  -r "$dist/requirements.txt"
uv pip install --python "$venv/bin/python" --compile-bytecode --no-deps "$dist"/prospero_fleet-*.whl
