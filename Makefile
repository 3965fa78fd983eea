# Every target builds the .venv it needs, so a fresh machine with python3, pip and make suffices.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LINT_STAMP := $(VENV)/.lint-installed

.PHONY: test demo lint bench protos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

$(LINT_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev,lint]'
	touch $(LINT_STAMP)

test: $(STAMP)
	$(PY) -m pytest

demo: $(STAMP)
	$(VENV)/bin/deviceplugin demo

lint: $(LINT_STAMP)
	$(PY) -m ruff check deviceplugin tests bench
	$(PY) -m mypy
	$(VENV)/bin/yamllint -s manifests config .yamllint.yaml
	$(VENV)/bin/kubernetes-validate --strict -k 1.30.0 manifests/*.yaml
	$(VENV)/bin/kubernetes-validate --strict -k 1.34.0 manifests/*.yaml
	$(VENV)/bin/hadolint Dockerfile

bench: $(STAMP)
	$(PY) -m bench

# Regenerate the committed gRPC stubs from protos/ (tests check they match).
protos: $(STAMP)
	$(PY) protos/generate.py

clean:
	rm -rf $(VENV) build *.egg-info
