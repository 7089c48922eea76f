#!/usr/bin/env bash
# Sets up everything `make train` and `make test` need, idempotently:
#   1. Debian packages: OpenMPI (mpirun, headers for mpi4py and Horovod), openssh (sshd for
#      multi-host jobs), cmake and a C++ compiler (Horovod builds from source). Installed
#      when missing and running as root; otherwise the exact apt-get line is printed.
#   2. A project virtualenv (.venv) with the pinned stack from requirements.txt and the lock
#      constraints.txt, then Horovod 0.28.1 built from source into a wheel cached per user
#      (~/.cache/sagemaker-horovod-byoc/wheels), so a rebuilt venv or another clone on the
#      same machine reinstalls it in seconds instead of compiling for minutes.
# A stamp file records the hash of the inputs; when it matches, nothing is done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
HOROVOD_VERSION=0.28.1
WHEELS=${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sagemaker-horovod-byoc/wheels}
APT_PACKAGES=(openmpi-bin libopenmpi-dev openssh-server openssh-client cmake g++ make)

missing_packages() {
  local pkg
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
  done
}

install_system_packages() {
  local missing
  missing=$(missing_packages | tr '\n' ' ')
  [ -z "${missing// /}" ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages: $missing" >&2
    echo "setup: install them with: sudo apt-get install -y $missing" >&2
    exit 1
  fi
  echo "setup: installing Debian packages: $missing"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
}

stamp_of_inputs() {
  cat requirements.txt constraints.txt scripts/setup.sh pyproject.toml | sha256sum | cut -d' ' -f1
}

build_horovod_wheel() {
  ls "$WHEELS"/horovod-"$HOROVOD_VERSION"-*.whl >/dev/null 2>&1 && return 0
  echo "setup: building Horovod $HOROVOD_VERSION from source (about 2-3 minutes)"
  mkdir -p "$WHEELS"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j"$(nproc)" \
    "$VENV/bin/pip" wheel --no-cache-dir --no-deps --no-build-isolation -w "$WHEELS" \
    "horovod==$HOROVOD_VERSION"
}

install_venv() {
  local stamp
  stamp=$(stamp_of_inputs)
  if [ -f "$VENV/.setup-stamp" ] && [ "$(cat "$VENV/.setup-stamp")" = "$stamp" ]; then
    return 0
  fi
  echo "setup: creating $VENV with the pinned stack"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip==26.3 wheel==0.48.0
  "$VENV/bin/pip" install -q -r requirements.txt -c constraints.txt
  build_horovod_wheel
  "$VENV/bin/pip" install -q --no-deps "$WHEELS"/horovod-"$HOROVOD_VERSION"-*.whl -c constraints.txt
  # Horovod's own runtime needs (cloudpickle, psutil, pyyaml, packaging) are in the lock.
  "$VENV/bin/pip" install -q cloudpickle psutil pyyaml packaging -c constraints.txt
  "$VENV/bin/pip" install -q --no-deps -e .
  "$VENV/bin/python" -c "import horovod.tensorflow.keras as hvd, mpi4py, tensorflow as tf; \
assert tf.__version__ == '2.15.1', tf.__version__"
  echo "$stamp" > "$VENV/.setup-stamp"
}

install_system_packages
install_venv
