# Everything starts from a fresh clone: `make train` and `make test` set up what they need.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.setup-stamp

.PHONY: setup train test test-unit

# --- training runtime (issue 2) ---------------------------------------------------------
$(SETUP_STAMP): requirements.txt constraints.txt scripts/setup.sh pyproject.toml
	bash scripts/setup.sh

setup: $(SETUP_STAMP)

## The main job: a real 2-process Horovod run on the embedded digits dataset.
train: setup
	$(PY) scripts/default_job.py

## The whole test suite (what CI runs).
test: setup
	$(PY) -m pytest -q

test-unit: setup
	$(PY) -m pytest -q -m "not container"
