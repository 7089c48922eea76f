#!/usr/bin/env bash
# Which container engine to use, in one place for the Makefile, the scripts and the tests.
#
#   scripts/engine.sh            prints "docker" or "podman"
#   source scripts/engine.sh     sets ENGINE and, for podman, exports CONTAINERS_CONF
#
# Rule: CONTAINER_ENGINE=docker|podman wins; otherwise Docker when a Docker daemon answers
# (`docker info`), else podman. With podman the project's own scripts/containers.conf is used
# through CONTAINERS_CONF (runc and rlimits these machines accept); nothing in /etc is edited.
# A CONTAINERS_CONF already set by the caller is left alone.

_engine_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

detect_engine() {
  case "${CONTAINER_ENGINE:-}" in
    docker|podman) echo "$CONTAINER_ENGINE"; return 0 ;;
    "") ;;
    *) echo "engine.sh: CONTAINER_ENGINE=$CONTAINER_ENGINE is not supported. Choose between docker, podman." >&2
       return 2 ;;
  esac
  if command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1; then
    echo docker
  elif command -v podman >/dev/null 2>&1; then
    echo podman
  else
    echo "engine.sh: no Docker daemon answers and podman is not installed;" \
         "install podman (make container-setup) or start Docker." >&2
    return 1
  fi
}

ENGINE=$(detect_engine) || { return 1 2>/dev/null || exit 1; }
if [ "$ENGINE" = podman ] && [ -z "${CONTAINERS_CONF:-}" ]; then
  export CONTAINERS_CONF="$_engine_dir/containers.conf"
fi

# Executed rather than sourced: print the engine.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "$ENGINE"
fi
