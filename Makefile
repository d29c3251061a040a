# kilonode: `make help` lists the targets.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CHECKOV_VENV := .venv-checkov
CHECKOV_VERSION := 3.3.30
STACK ?= local
OUT ?= out/$(STACK)

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# The host packages first: python3-venv among them, which the venvs below need (a bare Debian
# 12 has python3 without it). Each venv also waits for them (order-only), so `make -j` keeps the order.
setup: host-packages $(VENV)/.installed $(CHECKOV_VENV)/.installed ## Install the host packages, then create .venv with kilonode + test extras

test-artefacts: setup ## What the tests read but never download: cloud-init's schema, the image bases
	$(BIN)/python -m tests.artefacts
	# research-7500's pools add the GPU + InfiniBand base tests/image/test_gpu_image.py builds from
	$(BIN)/kilonode image prepare --stack research-7500

$(VENV)/.installed: pyproject.toml | host-packages
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# checkov (tests/k8s/test_checkov.py) in its own environment: checkov 3.3.30 requires
# packaging<24, pulumi packaging>=26, so pip cannot install both into .venv.
$(CHECKOV_VENV)/.installed: | host-packages
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q 'checkov==$(CHECKOV_VERSION)'
	touch $@

host-packages: ## Install the Debian packages set-up and the tests use (.ci/debian-packages.txt; apt, this machine's sources)
	scripts/install-host-packages

demo: setup ## Set up, then `kilonode local up STACK`: both etcd clusters + a worker VM, for real (`make render` only renders)
	$(BIN)/kilonode local up $(STACK)
	# `kilonode local status $(STACK) --json` lists what runs; `kilonode local down $(STACK)` stops it all

render: setup ## Render and explain the stack without running anything (STACK=..., OUT=...)
	$(BIN)/kilonode render $(STACK) --out $(OUT)
	$(BIN)/kilonode explain $(STACK)

test: test-artefacts ## Run every test, slow ones (VMs, etcd) included, and ruff
	$(BIN)/ruff check .
	# two workers, each test file whole on one (its module and session fixtures built once:
	# one image build, one verify boot per file); the slowest tests are listed at the end
	$(BIN)/pytest -n 2 --dist loadfile --durations=20

test-fast: setup ## Run the quick tier: tests marked neither slow nor medium (two workers, ~30 s)
	$(BIN)/python -m tests.artefacts
	# each test file whole on one worker: its module fixtures (graphs of stack variants, renders)
	# are built once, not once per worker; the shipped stacks' graphs the workers share (tests/shared.py).
	# Bytecode is written even where PYTHONDONTWRITEBYTECODE is set (__pycache__/ is ignored): without
	# it each worker compiles every test module and the package again, about 2.5 s of CPU each
	# The inner loop: each module over ~50 ms a test is marked `medium` (pyproject.toml) and runs in
	# `make test`; bench/bench_test_fast.py measures this target against its 30 s
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -m 'not slow and not medium' -n 2 --dist loadfile

golden: setup ## Regenerate tests/golden/<stack>/ and docs/stack-reference.md
	$(BIN)/python -m tests.golden.update

bench: setup ## Time render, validate and plan of research-7500 and of it scaled to 30,000 and 59,000 nodes, wall and CPU; the subnet planner on 256 pools (bench/results/render.json, plan.json)
	# both run and write their results; the target fails if either missed a target
	$(BIN)/python bench/bench_render.py; status=$$?; $(BIN)/python bench/bench_plan.py && exit $$status

bench-image: setup ## Time the node image: cold build, warm rebuild, boot + verify (bench/results/image.json)
	$(BIN)/python bench/bench_image.py

bench-local: setup ## Time `kilonode local up` cold (image built) and warm, a second up, and down (bench/results/local.json)
	$(BIN)/python bench/bench_local.py

bench-diff: setup ## Time `kilonode diff --base HEAD~1` on research-7500 in a scratch repo, wall and CPU, cache cold/warm/hot (target 10 s; bench/results/diff.json)
	$(BIN)/python bench/bench_diff.py

bench-test-fast: setup ## Time `make test-fast`'s pytest run, cold and warm graph cache (target 30 s; bench/results/test-fast.json)
	$(BIN)/python bench/bench_test_fast.py

bench-preflight: setup ## Time `kilonode preflight research-7500`, the whole process (target: a few seconds; bench/results/preflight.json)
	$(BIN)/python bench/bench_preflight.py

bench-etcd: setup ## Main etcd latency under an event storm, isolated vs shared (~4 min; bench/results/etcd-isolation.json)
	$(BIN)/python bench/bench_etcd_isolation.py

bench-leases: setup ## Main etcd latency with the Lease renewals in main vs in etcd.leases (~4 min; bench/results/lease-split.json)
	$(BIN)/python bench/bench_lease_split.py
.PHONY: bench-etcd bench-leases bench-diff bench-preflight bench-test-fast

bench-reboot: setup ## Reboot a VM 20 times per mechanism, count the hangs (bench/results/reboot.json)
	$(BIN)/python bench/bench_reboot.py --mode both --cycles 20

lint: setup ## ruff
	$(BIN)/ruff check .

.PHONY: help setup test-artefacts host-packages demo render test test-fast golden bench bench-image bench-local \
	bench-reboot lint
