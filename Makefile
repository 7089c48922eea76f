# Everything starts from a fresh clone: `make train` and `make test` set up what they need.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.setup-stamp

.PHONY: setup train train-images test test-slow test-unit lint

# --- training runtime -----------------------------------------------------------------
$(SETUP_STAMP): requirements.txt constraints.txt scripts/setup.sh pyproject.toml
	bash scripts/setup.sh

setup: $(SETUP_STAMP)

## The main job: a real 2-process Horovod run on the embedded digits dataset.
train: setup
	$(PY) scripts/default_job.py

## The same 2-rank job: mobilenet_v2 on the digits as a folder of 32x32 PNG images.
train-images: setup
	$(PY) scripts/default_job.py --data images --model mobilenet_v2 --epochs 3

## The test suite in timed phases: set-up, lint, unit (the images build beside), container. Every test but the
## long scenarios marked `slow`, under 20 minutes on a fresh 2-core machine.
test:
	bash scripts/test_phases.sh fast

## The long scenarios (marked `slow`: minute-scale deadlines waited out, a matrix's further rows,
## paths a faster test also drives), same phases. CI (.ci/run) runs `make test`, then this.
test-slow:
	bash scripts/test_phases.sh slow

## Lint and types (the first phase of `make test`): ruff's rules and formatting (pyproject.toml),
## then mypy: strict on job/, container/, sagemaker_ops/, serve/ and bench/, the bodies of train/
## and scripts/ checked too ([tool.mypy] in pyproject.toml).
## `ruff check --fix . && ruff format .` fixes most.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

## The inner loop: every test but the container ones (no image build, no podman).
test-unit: setup
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not container"

# --- container image, local clusters, push --------------------------------------------
# Docker when a daemon answers, else podman with the project's scripts/containers.conf
# (scripts/engine.sh; CONTAINER_ENGINE=docker|podman overrides). VARIANT=gpu|cpu (default:
# gpu when nvidia-smi sees a GPU, else cpu). See docs/image.md.
.PHONY: container-setup base-image build build-tf build-tf-gpu test-container local-train local-serve push
HOSTS ?= 2
LOCAL_EPOCHS ?= 5
SERVE_PORT ?= 8080
LOCAL_DIR := build/local-cluster
LOCAL_DATA := build/local-data

## Host packages for containers (podman, runc, netavark, debootstrap, docker-registry ...).
container-setup:
	bash scripts/container_setup.sh

base-image: container-setup
	bash scripts/make_base_image.sh

build: container-setup
	bash scripts/build_image.sh

## The TensorFlow 2.21 image (MultiWorkerMirroredStrategy), CPU: sagemaker-horovod:tf-cpu.
build-tf: container-setup
	STACK=tf VARIANT=cpu bash scripts/build_image.sh

## Its GPU variant, from the local Debian base (CUDA as wheels; nothing compiled), then the
## AWS-style MWMS script on 2 workers inside it (on CPU here) and the image's size.
build-tf-gpu: setup container-setup
	STACK=tf VARIANT=gpu bash scripts/build_image.sh
	$(PY) scripts/tf_image_check.py sagemaker-horovod:tf-gpu

## The container tests: image, compose clusters, faults, serving, push (part of `make test`).
test-container: setup container-setup
	$(PY) -m pytest -q -m container tests/image

## A local SageMaker-style cluster of HOSTS containers on the embedded digits dataset.
local-train: setup container-setup
	$(PY) scripts/default_job.py --ml-root $(LOCAL_DATA) --epochs $(LOCAL_EPOCHS) --processes 1 --no-run
	image=$$(bash scripts/build_image.sh | tail -n 1) && \
	$(PY) scripts/local_cluster.py train --hosts $(HOSTS) --image "$$image" \
	  --workdir $(LOCAL_DIR) --data $(LOCAL_DATA)/input/data \
	  --hyperparameters $(LOCAL_DATA)/input/config/hyperparameters.json

## Serve the model of the last local-train on SERVE_PORT (Ctrl-C stops it).
local-serve: setup container-setup
	image=$$(bash scripts/build_image.sh | tail -n 1) && \
	$(PY) scripts/local_cluster.py serve --image "$$image" --model $(LOCAL_DIR)/algo-1/model \
	  --port $(SERVE_PORT)

## Build and push to ECR (NAME, TAG, VARIANT=gpu; REGISTRY=host:port for another registry).
push: container-setup
	bash scripts/build_and_push.sh

# --- SageMaker operator tools ---------------------------------------------------------
# Each verb takes its options in ARGS; add --dry-run to print the requests and send nothing,
# --wait to follow status and logs. `.venv/bin/sagemaker-ops VERB --help` lists them all.
#   make sagemaker-train ARGS="--image URI --role ARN --output-path s3://bucket/out \
#                              --channel train=s3://bucket/train/ --dry-run"
.PHONY: sagemaker-train sagemaker-register sagemaker-deploy sagemaker-transform
SAGEMAKER_TOOL := $(VENV)/bin/sagemaker-ops

## Launch a training job with this image (CreateTrainingJob).
sagemaker-train: setup
	$(SAGEMAKER_TOOL) train $(ARGS)

## Register the image as a SageMaker algorithm (CreateAlgorithm).
sagemaker-register: setup
	$(SAGEMAKER_TOOL) register $(ARGS)

## Model + endpoint config + endpoint from a finished job (--training-job) or --model-data.
sagemaker-deploy: setup
	$(SAGEMAKER_TOOL) deploy $(ARGS)

## Batch transform with an existing model (--model-name) or a new one.
sagemaker-transform: setup
	$(SAGEMAKER_TOOL) transform $(ARGS)

# --- inference server -----------------------------------------------------------------
# See docs/serving.md. The benchmark trains the default job into build/bench-serve
# first when no model is there.
.PHONY: test-serve bench-serve soak-serve

## The inference server's tests (unit, fuzzing, end to end with the real trainer).
test-serve: setup
	$(PY) -m pytest -q tests/serve

## Requests/s and p50/p99 (wrk) of serve vs a careful BYOC server, MLP and CNN, c=1..64.
bench-serve: setup
	$(PY) -m bench.serving

## Minutes of mixed valid/invalid traffic at c=64 plus slow clients: no 5xx, answers, memory.
soak-serve: setup
	$(PY) -m bench.serving --soak

# --- training performance benchmarks --------------------------------------------------
# One table (metric, this project, reference, ratio, target, met) on stdout; the full results
# in results/bench-<date>.json and results/bench-latest.{json,md}. Items 1-6 take 4-6 minutes on 2 cores,
# item 7 (data at scale) 5-12 more.
# Item 4 runs on the local compose cluster when the image exists (BENCH_IMAGE, by default the
# one `make build` makes), else on two launchers on 127.0.0.1/127.0.0.2; the table names which.
# See bench/runner.py.
.PHONY: bench bench-tiny
BENCH_IMAGE ?=
BENCH_ARGS ?=

## Allreduce busbw, trainer scaling, accumulation, cluster overhead, input, peak RSS.
bench: setup
	$(PY) -m bench $(if $(BENCH_IMAGE),--image $(BENCH_IMAGE)) $(BENCH_ARGS)

## The same at a tiny size (about a minute idle): checks that every benchmark runs.
bench-tiny: setup
	$(PY) -m bench --tiny $(if $(BENCH_IMAGE),--image $(BENCH_IMAGE)) $(BENCH_ARGS)
