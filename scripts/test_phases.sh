#!/usr/bin/env bash
# `make test` (TIER fast, the default) and `make test-slow` (TIER slow): the suite from a fresh
# clone, in phases, each timed, with the times printed at the end (also when a phase fails).
#   scripts/test_phases.sh [fast|slow]
# The fast tier is every test not marked `slow`, under 20 minutes on a fresh 2-core machine; the
# slow tier is the long scenarios (pyproject.toml's markers say which), for CI (.ci/run runs both)
# and before a release. Set-up and image builds are done once: the second tier finds them done.
#   set-up           scripts/container_setup.sh, scripts/setup.sh (venv, Horovod wheel), the
#                    local Debian base image and scripts/setup_sdk.sh (the SDK 2 and 3, the
#                    MLflow server and the GPU machine's stand-in test venvs); the TensorFlow
#                    2.21 image (STACK=tf) starts building as soon as the base image is made
#   lint             `make lint`: ruff (rules, formatting) and mypy; a failure ends the run
#   unit tests       every test but the container ones (real mpirun, Horovod, sshd, HTTP);
#                    the CPU image builds beside them (it takes set-up's Horovod wheel), as
#                    the TensorFlow one goes on doing (scripts/build_image.sh), logs in
#                    build/image-*.log
#   image wait       what is left of those builds when the unit tests end
#   container tests  tests/image: both images, compose clusters, the fault matrices, push
# PYTEST_ARGS adds arguments to both pytest runs.
set -uo pipefail
cd "$(dirname "$0")/.."

name=${1:-fast}
case "$name" in
  fast) tier="not slow" ;;
  slow) tier="slow" ;;
  *) echo "test_phases: give the tier, fast or slow (not '$name')" >&2; exit 2 ;;
esac

PY=.venv/bin/python
phases=()
started=$SECONDS

report() {
  echo
  echo "make test ($name tier): time per phase"
  local line
  for line in "${phases[@]}"; do echo "  $line"; done
  echo "  total            $((SECONDS - started)) s"
}
trap report EXIT

phase() {
  local name=$1 start=$SECONDS status
  shift
  echo "=== make test: $name"
  "$@"
  status=$?
  phases+=("$(printf '%-16s %4d s%s' "$name" $((SECONDS - start)) "$([ $status -ne 0 ] && echo "  (failed: $status)")")")
  [ $status -eq 0 ] || exit $status
}

# The images build in the background, which the unit tests (the longer path) do not need: with
# no layer cached they took 285 and 346 s beside the unit tests, which took 590 s (389 s with
# both images cached). In the background for real: `nice` reaches the engine's own work
# (layers, commits) but not the Dockerfile's RUN steps, which run in a cgroup of their own that
# the kernel weighs against the tests' processes as one of them, whatever its nice value; a
# weight of 2 against their 1024 (--cpu-shares) leaves them the CPU that the tests and set-up
# leave idle. The TensorFlow 2.21 image needs only the local base image, so it starts in
# set-up, as soon as that is made (debootstrap: mostly downloads), and takes the CPU that
# set-up's downloads leave; the CPU image takes set-up's Horovod wheel.
background_build() {
  BUILD_ARGS="--cpu-shares 2" nice -n 10 bash scripts/build_image.sh
}
mkdir -p build
phase "Debian packages" bash scripts/container_setup.sh
{ bash scripts/make_base_image.sh && STACK=tf background_build; } > build/image-tf.log 2>&1 &
tf_build=$!
# The test venvs (downloads) beside the venv and the Horovod compile (CPU).
phase "set-up" bash -c '{ bash scripts/setup_sdk.sh 3 && bash scripts/setup_sdk.sh 2; } & sdk=$!
                        { bash scripts/setup_sdk.sh mlflow && bash scripts/setup_sdk.sh gpu; } &
                        tools=$!
                        bash scripts/setup.sh; built=$?
                        wait $sdk && wait $tools && exit $built'
phase "lint" make --no-print-directory lint
background_build > build/image-cpu.log 2>&1 &
cpu_build=$!
# Two pytest workers (pytest-xdist), each taking whole files: most tests wait on processes,
# containers or deadlines as much as they compute, so two at a time fill the 2 cores better.
# The files with long jobs go first, by their last run's seconds (tests/file_order.py).
# shellcheck disable=SC2086  # PYTEST_ARGS is a list of arguments
phase "unit tests" $PY -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder \
  -m "not container and $tier" ${PYTEST_ARGS:-}
wait_images() {
  local status=0
  wait "$cpu_build" || { tail -n 40 build/image-cpu.log; status=1; }
  wait "$tf_build" || { tail -n 40 build/image-tf.log; status=1; }
  return $status
}
phase "image wait" wait_images
# shellcheck disable=SC2086
phase "container tests" env TEST_IMAGE_BUILT=1 \
  $PY -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "container and $tier" tests/image \
  ${PYTEST_ARGS:-}
