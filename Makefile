# The README's two commands: `make demo` (set up, then replay the built-in suite) and `make test`.
# A virtual environment that sees the system's packages: a machine that already has a (CUDA) torch keeps
# it; only where no torch is importable is the CPU build torch==2.13.0 installed, before the project, so
# that pip never resolves torch itself (which would download a multi-GB CUDA build).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint claims claims-check
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv --system-site-packages $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test,hf,plot,dev]"
	touch $@

demo: setup
	$(BIN)/logitreplay replay

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/python -m ruff check logitreplay tests bench
	$(BIN)/python -m mypy

# Every figure table of README.md, bench/RESULTS.md, bench/FIDELITY.md, bench/PEERS.md and docs/reliability.md,
# rendered from the committed results under bench/results/ (bench/claims.py says how to register a table).
claims: setup
	$(BIN)/python bench/claims.py

# Fails when a committed document differs from what its data renders (CI runs it; no GPU needed).
claims-check: setup
	$(BIN)/python bench/claims.py --check
