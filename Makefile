# Hotline: `make serve` runs the server, `make test` runs the checks and tests,
# `make test-fast` the unit tests alone (about two and a half minutes on 2 cores).
# All create (or reuse) the virtual environment in .venv and install what they need.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Debian packages the tests use: test speech (espeak-ng, sox), the browser test (chromium), Redis,
# a real SIP softphone as the caller of the SIP tests (baresip), a SIP dispatcher (kamailio).
TEST_DEBS := espeak-ng sox chromium redis-server baresip kamailio

# Python writes the bytecode of what it imports (an environment that says
# PYTHONDONTWRITEBYTECODE makes every process compile Hotline and its libraries again: 3.5
# instead of 1.6 s to import the server, in every test worker, server and CLI the tests start).
unexport PYTHONDONTWRITEBYTECODE

# The real-time tests mostly wait on the clock, so more workers than cores still pay off.
TEST_WORKERS ?= 6

.PHONY: serve test test-fast lint system-deps clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# No bytecode for all of site-packages up front (27 s of a fresh install on 2 cores): Python
	# compiles what is imported, on first import.
	$(BIN)/python -m pip install --quiet --no-compile -e '.[dev]'
	$(BIN)/hotline fetch-models
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/hotline serve

system-deps:
	@missing=""; for deb in $(TEST_DEBS); do dpkg -s $$deb >/dev/null 2>&1 || missing="$$missing $$deb"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Everything: the lint beside all tests but the `serial` ones, in parallel (those mostly wait on
# the clock, so the lint's CPU costs them little); then the `serial` ones (they assert times
# measured on real-time calls) alone on an otherwise idle machine. All always run.
test: $(STAMP) system-deps
	@status=0; \
	$(MAKE) --no-print-directory lint > $(VENV)/lint.log 2>&1 & lint=$$!; \
	$(BIN)/pytest -m "not serial" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 || status=$$?; \
	wait $$lint || status=1; \
	echo "--- lint:"; cat $(VENV)/lint.log; \
	$(BIN)/pytest -m serial --durations=15 || status=$$?; \
	exit $$status

# The unit tests: no server processes, no calls placed over a wire. Many still run a
# conversation in-process on the clock (speculation, tools), so as in `test` more workers
# than cores pay off: 2.5 minutes with 4 or 6 on 2 cores, 3.3 with 2.
test-fast: $(STAMP) system-deps
	$(BIN)/pytest -m "not slow" -n $(TEST_WORKERS) --durations=15

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
