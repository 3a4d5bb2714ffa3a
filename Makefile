# Quick start:  make run   (set up .venv, compile and run ResNet50 on the CPU, check it)
#               make test  (set up .venv, run the test suite)
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench setup clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/tilefuse run

# one pytest worker per core, at most 4 (each worker compiles its own kernels and may use several GiB); a
# whole test file per worker, so a file's module-scoped fixtures (compiled networks) are built once
TEST_ARGS ?= -n logical --maxprocesses 4 --dist loadfile

test: $(STAMP)
	$(BIN)/python -m pytest $(TEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
