# Two commands for a newcomer: `make demo` (runs the main job) and `make test` (runs the whole suite).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo test check protos check-protos lint format install install-dev bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# The services and example agents (no trainer: the demo needs no GPU stack).
$(VENV)/.installed-run: pyproject.toml | $(PY)
	$(PIP) install --quiet -e '.[all]'
	touch $@

# Everything the tests need, trainer included. torch comes first and pinned: it is the CPU build on this
# machine's disk; a looser request would pull a multi-GB CUDA build.
$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(PIP) install --quiet 'torch==2.13.0'
	$(PIP) install --quiet -e '.[dev,trainer]'
	touch $@ $(VENV)/.installed-run

install: $(VENV)/.installed-run
install-dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed-run
	$(PY) tools/demo.py

test: $(VENV)/.installed-dev
	$(PY) -m pytest tests

# Static checks CI runs before the tests: generated code fresh, buf lint, ruff.
check: check-protos lint

protos: $(VENV)/.installed-dev
	$(PY) tools/gen_protos.py

check-protos: protos
	git diff --exit-code -- services/_gen || (echo "generated code in services/_gen is stale: run 'make protos' and commit" >&2; exit 1)
	test -z "$$(git status --porcelain -- services/_gen)" || (echo "untracked generated files: run 'make protos' and commit" >&2; exit 1)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/buf lint
	$(VENV)/bin/buf format --diff --exit-code
	$(VENV)/bin/ruff check services tests bench examples tools deploy
	$(VENV)/bin/ruff format --check services tests bench examples tools deploy

format: $(VENV)/.installed-dev
	$(VENV)/bin/buf format -w
	$(VENV)/bin/ruff check --fix services tests bench examples tools deploy
	$(VENV)/bin/ruff format services tests bench examples tools deploy

bench: $(VENV)/.installed-dev
	for b in bench/*_bench.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) data demo-output .pytest_cache .ruff_cache
