#!/usr/bin/env bash
# Builds the image with whichever engine scripts/engine.sh picks.
#
#   STACK=horovod|tf  default: horovod (TensorFlow 2.15 + Horovod); tf = TensorFlow 2.21 with
#                     its MultiWorkerMirroredStrategy
#   VARIANT=cpu|gpu   default: gpu when nvidia-smi sees a GPU, else cpu
#   IMAGE=NAME:TAG    default: sagemaker-horovod:$VARIANT, sagemaker-horovod:tf-$VARIANT for tf
#   BASE_IMAGE, BUILD_BASE_IMAGE
#                     horovod gpu: the Dockerfile's CUDA 12.2 / cuDNN 8.9 images.
#                     horovod cpu, and tf in both variants (it compiles nothing; CUDA comes as
#                     wheels): the local debootstrap Debian base (made once by
#                     scripts/make_base_image.sh, since no registry can be pulled from here);
#                     BASE_IMAGE=debian:bookworm-slim works where a registry is reachable.
#   BUILD_CA          a CA bundle that the build's downloads trust (default: this machine's
#                     /etc/ssl/certs/ca-certificates.crt when there is one; none: pip's own
#                     list). It reaches the Dockerfile's download steps as the build secret
#                     build_ca, which no layer keeps: the image trusts only its distribution's
#                     ca-certificates, whatever proxy this machine needs.
#   BUILD_ARGS        extra arguments for `ENGINE build`, e.g. "--build-arg SCRIPT_MODE=off"
#                     (an image for others: runs only the built-in trainer; docs/image.md)
#   HOROVOD_PREBUILT  cpu from the local base: 1 (default when scripts/setup.sh cached one in
#                     .cache/wheels) reuses the host's Horovod wheel; 0 compiles it in the build
# Prints the image name on the last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/engine.sh

if [ -z "${VARIANT:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then VARIANT=gpu; else VARIANT=cpu; fi
fi
case "$VARIANT" in
  cpu|gpu) ;;
  *) echo "build_image: VARIANT=$VARIANT is not supported. Choose between cpu, gpu." >&2; exit 2 ;;
esac
STACK=${STACK:-horovod}
case "$STACK" in
  horovod) IMAGE=${IMAGE:-sagemaker-horovod:$VARIANT} ;;
  tf) IMAGE=${IMAGE:-sagemaker-horovod:tf-$VARIANT} ;;
  *) echo "build_image: STACK=$STACK is not supported. Choose between horovod, tf." >&2; exit 2 ;;
esac

args=(--build-arg "VARIANT=$VARIANT" --build-arg "STACK=$STACK" -t "$IMAGE" -f Dockerfile)
# Where scripts/setup.sh caches its Horovod wheel (its WHEELS; a test keeps the two equal), and
# the folder of the build context the Dockerfile picks a prebuilt wheel up from.
HOST_WHEELS=${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sagemaker-horovod-byoc/wheels}
# One folder per stack and variant, so that builds of different images can run at once.
CONTEXT_WHEELS=build/context-wheels/$STACK-$VARIANT
rm -rf "$CONTEXT_WHEELS" && mkdir -p "$CONTEXT_WHEELS"
if { [ "$VARIANT" = cpu ] || [ "$STACK" = tf ]; } && [ -z "${BASE_IMAGE:-}" ]; then
  BASE_IMAGE=${LOCAL_BASE_IMAGE:-localhost/sagemaker-byoc-base:bookworm}
  scripts/make_base_image.sh "$BASE_IMAGE" >&2
  # The local base is this host's Debian 12 with Python 3.11 and Debian's OpenMPI, so the
  # Horovod wheel scripts/setup.sh compiled here (same pins) fits it: no second compile.
  if [ "$STACK" = horovod ] && compgen -G "$HOST_WHEELS/horovod-*-cp311-*.whl" >/dev/null; then
    cp "$HOST_WHEELS"/horovod-*-cp311-*.whl "$CONTEXT_WHEELS/"
    args+=(--build-arg HOROVOD_PREBUILT="${HOROVOD_PREBUILT:-1}")
  fi
fi
if [ -n "${BASE_IMAGE:-}" ]; then
  args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "BUILD_BASE_IMAGE=${BUILD_BASE_IMAGE:-$BASE_IMAGE}")
elif [ -n "${BUILD_BASE_IMAGE:-}" ]; then
  args+=(--build-arg "BUILD_BASE_IMAGE=$BUILD_BASE_IMAGE")
fi
BUILD_CA=${BUILD_CA-/etc/ssl/certs/ca-certificates.crt}
if [ -n "$BUILD_CA" ] && [ -s "$BUILD_CA" ]; then
  args+=(--secret "id=build_ca,src=$BUILD_CA" --build-arg PIP_CERT=/run/secrets/build_ca)
fi
# podman: RUN steps reach Debian's and PyPI's mirrors through the host's network; the Docker
# image format, because the OCI format drops SHELL (the Dockerfile's bash -o pipefail).
if [ "$ENGINE" = podman ]; then args+=(--network host --format docker); fi
if [ -n "${BUILD_ARGS:-}" ]; then
  # shellcheck disable=SC2206  # word splitting wanted: several arguments in one variable
  args+=($BUILD_ARGS)
fi

echo "build_image: $ENGINE build ${args[*]} ." >&2
start=$(date +%s)
"$ENGINE" build "${args[@]}" . >&2
echo "build_image: built $IMAGE ($STACK, $VARIANT) in $(( $(date +%s) - start )) s" >&2
echo "$IMAGE"
