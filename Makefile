# Two commands do all setup on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean

# torch goes first, pinned: with it present, the project's `torch>=2.6` pulls nothing more
# (a plain `torch` requirement would download a multi-GB CUDA build). On a machine without a
# GPU, `make install TORCH_INDEX=https://download.pytorch.org/whl/cpu` takes the CPU build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install --quiet -e '.[dev]'
	@# compile the cost model's kernels into numba's cache now: a first `spantrain plan` took 13 s, not 1 s
	$(BIN)/python -m spantrain plan --cluster examples/cee-demo.yaml --model tiny-gpt --planner heuristic > /dev/null
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	PATH=$(BIN):$$PATH WANDB_MODE=$${WANDB_MODE:-offline} bash experiments/demo.sh

test: $(STAMP)
	$(BIN)/ruff check .
	WANDB_MODE=offline $(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) out build *.egg-info .pytest_cache .ruff_cache
