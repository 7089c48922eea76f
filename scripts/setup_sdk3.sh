#!/usr/bin/env bash
# The SageMaker Python SDK 3 (`ModelTrainer`, package sagemaker-train) in a virtualenv of its
# own, .venv-sdk3, for the tests that run its local container mode against the image
# (tests/image/test_sdk3_local_mode.py). A test-only dependency: it needs numpy 2 and protobuf
# 5+, which the TensorFlow 2.15 stack of .venv cannot take, and nothing of it enters the image.
# Locked by constraints-sdk3.txt; a stamp of the inputs makes a second run do nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
VENV=.venv-sdk3
SDK="sagemaker-train==1.27.0"
stamp=$(cat constraints-sdk3.txt scripts/setup_sdk3.sh | sha256sum | cut -d' ' -f1)
if [ -f "$VENV/.setup-stamp" ] && [ "$(cat "$VENV/.setup-stamp")" = "$stamp" ]; then
  exit 0
fi
echo "setup_sdk3: creating $VENV with $SDK"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "$SDK" -c constraints-sdk3.txt
"$VENV/bin/python" -c "from sagemaker.train.model_trainer import ModelTrainer"
echo "$stamp" > "$VENV/.setup-stamp"
