# Two commands: `make demo` and `make test`. Each sets up .venv itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-slow lint bench clean cross-tools

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/python examples/demo.py

# The aarch64 cross compiler and qemu for the `kiln export` tests; where apt cannot provide
# them (no root, no network), those tests skip and the build goes on.
cross-tools:
	@command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null || \
	  { apt-get update -q >/dev/null 2>&1; \
	    apt-get install -y -q gcc-aarch64-linux-gnu qemu-user >/dev/null 2>&1; } || \
	  echo "cross-tools: no aarch64-linux-gnu-gcc/qemu-aarch64; the aarch64 tests will skip"

test: $(VENV)/.installed-test cross-tools
	$(BIN)/python -m pytest -q -m "not slow" -n auto

test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m slow -n auto

lint: $(VENV)/.installed-test
	$(BIN)/ruff check kiln tests benchmarks examples
	$(BIN)/mypy

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/frontend.py
	$(BIN)/python benchmarks/optimize.py
	$(BIN)/python benchmarks/ad.py
	$(BIN)/python benchmarks/codegen.py
	$(BIN)/python benchmarks/native.py
	$(BIN)/python benchmarks/runtime.py
	$(BIN)/python benchmarks/models.py
	$(BIN)/python benchmarks/build.py
	$(BIN)/python benchmarks/peers.py
	$(BIN)/python benchmarks/alternate.py
	$(BIN)/python benchmarks/conv_layers.py
	$(BIN)/python benchmarks/treelstm.py
	$(BIN)/python benchmarks/dynamic_shapes.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
