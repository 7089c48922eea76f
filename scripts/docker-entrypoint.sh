#!/bin/sh
# The image's ENTRYPOINT. SageMaker runs `docker run IMAGE train` or `... serve`; the argument
# is replaced by this process (exec), so `train` / `serve` become PID 1 and get SIGTERM
# directly. Any other command (bash, python ...) runs the same way, for debugging.
set -e
if [ "$#" -eq 0 ]; then
  set -- train
fi
exec "$@"
