# Two commands for a newcomer: `make demo` and `make test`. Both set up .venv from scratch.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Pinned here only: on the project's machines this resolves to a CPU build from local disk.
# pyproject.toml keeps a range so the CUDA/ROCm images keep their own torch.
TORCH  := torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/rentune validate jobspec/examples/quickstart.yaml
	HF_HUB_OFFLINE=1 $(BIN)/rentune run jobspec/examples/quickstart.yaml --store file://$(CURDIR)/runs

lint: $(STAMP)
	$(BIN)/ruff check jobspec entrypoint tests bench deploy
	$(BIN)/ruff format --check jobspec entrypoint tests bench deploy

test: lint
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
