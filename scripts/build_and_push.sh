#!/usr/bin/env bash
# Builds the image and pushes it to Amazon ECR, or to any registry.
#
#   scripts/build_and_push.sh [NAME [TAG]]      (make push NAME=... TAG=...)
#
#   NAME       repository name (default sagemaker-horovod)
#   TAG        image tag (default: the variant, gpu or cpu)
#   VARIANT    gpu (default: the image SageMaker's GPU instances run) or cpu
#   REGISTRY   unset: ECR. The account comes from `aws sts get-caller-identity`, the region
#              from AWS_REGION / AWS_DEFAULT_REGION / `aws configure get region`; the
#              repository is created when missing, and the engine logs in with
#              `aws ecr get-login-password`. Pushes ACCOUNT.dkr.ecr.REGION.amazonaws.com/NAME:TAG.
#              Set: push to REGISTRY/NAME:TAG as is, with no AWS call (a registry you are
#              already logged in to, or a local one such as 127.0.0.1:5000; a loopback
#              registry is spoken to over plain HTTP, as Docker does).
#   SKIP_BUILD=1  push the local image NAME:VARIANT as it is.
# Other build settings (BASE_IMAGE, BUILD_ARGS ...) are scripts/build_image.sh's.
# Prints the pushed image's full name on the last line.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/engine.sh

NAME=${1:-${NAME:-sagemaker-horovod}}
VARIANT=${VARIANT:-gpu}
TAG=${2:-${TAG:-$VARIANT}}
LOCAL_IMAGE="$NAME:$VARIANT"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  IMAGE="$LOCAL_IMAGE" VARIANT="$VARIANT" scripts/build_image.sh >/dev/null
fi

push_args=()
if [ -z "${REGISTRY:-}" ]; then
  command -v aws >/dev/null || {
    echo "build_and_push: the AWS CLI is needed for ECR (pip install awscli), or set REGISTRY" >&2; exit 1; }
  REGION=${AWS_REGION:-${AWS_DEFAULT_REGION:-$(aws configure get region || true)}}
  [ -n "$REGION" ] || { echo "build_and_push: no AWS region: set AWS_REGION" >&2; exit 1; }
  ACCOUNT=$(aws sts get-caller-identity --query Account --output text)
  REGISTRY="$ACCOUNT.dkr.ecr.$REGION.amazonaws.com"
  if ! aws ecr describe-repositories --region "$REGION" --repository-names "$NAME" >/dev/null 2>&1; then
    echo "build_and_push: creating ECR repository $NAME in $REGION" >&2
    aws ecr create-repository --region "$REGION" --repository-name "$NAME" >/dev/null
  fi
  aws ecr get-login-password --region "$REGION" \
    | "$ENGINE" login --username AWS --password-stdin "$REGISTRY" >&2
else
  case "$REGISTRY" in
    127.*|localhost|localhost:*)
      if [ "$ENGINE" = podman ]; then push_args+=(--tls-verify=false); fi ;;
  esac
fi

REMOTE="$REGISTRY/$NAME:$TAG"
"$ENGINE" tag "$LOCAL_IMAGE" "$REMOTE"
echo "build_and_push: pushing $REMOTE" >&2
start=$(date +%s)
"$ENGINE" push "${push_args[@]}" "$REMOTE" >&2
echo "build_and_push: pushed $REMOTE in $(( $(date +%s) - start )) s" >&2
echo "$REMOTE"
