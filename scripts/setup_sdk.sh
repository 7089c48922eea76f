#!/usr/bin/env bash
# Test-only tools in virtualenvs of their own: the SageMaker Python SDK, for the tests that run
# its local container mode against the image (tests/image/test_sdk_local_mode.py), and an
# MLflow tracking server for the tests of the job's MLflow run (tests/container/test_mlflow.py),
# and a Python like the lent GPU machine's for the GPU check's test (tests/container/
# test_gpu_check.py: JAX and what Keras finds there, nothing of this project's):
#
#   scripts/setup_sdk.sh 3       .venv-sdk3: SDK 3 (`ModelTrainer`, package sagemaker-train)
#   scripts/setup_sdk.sh 2       .venv-sdk2: SDK 2 (`Estimator`, package sagemaker<3)
#   scripts/setup_sdk.sh mlflow  .venv-mlflow: `mlflow server` (the whole mlflow package)
#   scripts/setup_sdk.sh gpu     .venv-gpu: JAX (CPU) and Keras's needs but Keras, no MPI
#
# They need numpy 2 and protobuf 4+, which the TensorFlow 2.15 stack of .venv cannot take, and
# nothing of them enters the image. Each is locked by constraints-sdkN.txt (the server by
# constraints-mlflow.txt, the GPU machine's stand-in by the TF 2.21 image's constraints-tf.txt);
# a stamp of the inputs makes a second run do nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
case "${1:-}" in
  2) SDK="sagemaker==2.257.7"; CHECK="from sagemaker.estimator import Estimator; import sagemaker.local" ;;
  3) SDK="sagemaker-train==1.27.0"; CHECK="from sagemaker.train.model_trainer import ModelTrainer; import sagemaker.train.local.local_container, sagemaker.core.local" ;;
  mlflow) SDK="mlflow==3.17.2"; CHECK="import mlflow.server" ;;
  gpu) SDK="jax jaxlib numpy h5py ml_dtypes absl-py rich packaging six python-dateutil urllib3
            certifi typing_extensions"; CHECK="import jax.numpy" ;;
  *) echo "setup_sdk: give the SDK's major version (2 or 3), mlflow or gpu" >&2; exit 2 ;;
esac
VENV=.venv-sdk$1 LOCK=constraints-sdk$1.txt INPUTS=()
if [ "$1" = mlflow ]; then VENV=.venv-mlflow LOCK=constraints-mlflow.txt; fi
if [ "$1" = gpu ]; then VENV=.venv-gpu LOCK=constraints-tf.txt INPUTS=(scripts/gpu_check.sh); fi
stamp=$(cat "$LOCK" scripts/setup_sdk.sh "${INPUTS[@]}" | sha256sum | cut -d' ' -f1)
if [ -f "$VENV/.setup-stamp" ] && [ "$(cat "$VENV/.setup-stamp")" = "$stamp" ]; then
  exit 0
fi
echo "setup_sdk: creating $VENV with $SDK"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# --no-compile: compiling every module of the SDK's hundred-odd packages up front took as long
# as the install itself. What the tests use is compiled instead, by importing it once with
# bytecode writing on (CHECK: the SDK and its local mode). Otherwise, where
# PYTHONDONTWRITEBYTECODE is set (as on these machines), every SDK process compiled them again
# (6 s to import SDK 3 instead of 3).
# shellcheck disable=SC2086  # SDK is a list of requirements
"$VENV/bin/pip" install -q --disable-pip-version-check --no-compile $SDK -c "$LOCK"
env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -c "$CHECK"
if [ "$1" = gpu ]; then  # what the lent machine is carried, for this venv's Python
  bash scripts/gpu_check.sh prepare "$VENV/wheels" \
    "$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
fi
echo "$stamp" > "$VENV/.setup-stamp"
