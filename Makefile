# ember — the two commands a newcomer needs:
#   make test   set up this host (root), then lint, type-check and run every test
#   make run    set up this host, then run the collector and the agent on it
VENV ?= .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.setup-done

.PHONY: setup fixtures web proto lint test unit run bench image clean

# The container image of deploy/Dockerfile, under the name
# deploy/kubernetes/kustomization.yaml uses (docs/install.md says how to push
# it to a registry of one's own: make image IMAGE=registry.example.com/ember:TAG).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= localhost/ember:$(VERSION)
ENGINE ?=

$(SETUP_STAMP): deploy/host-setup.sh pyproject.toml deploy/web/build.sh deploy/web/package-lock.json
	deploy/host-setup.sh --dev --venv $(VENV)
	touch $@

# Re-runs the idempotent host set-up every time: headers and mounts are host
# state that a reboot or a fresh machine loses.
setup:
	deploy/host-setup.sh --dev --venv $(VENV)
	touch $(SETUP_STAMP)

fixtures:
	$(MAKE) -s -C tests/fixtures

# The web UI's chart library (uPlot), from deploy/web/package-lock.json into
# daemon/ember/collector/web/vendor/ (the set-up runs it too; a no-op when
# the copied version is the locked one).
web:
	deploy/web/build.sh

# Regenerate the protobuf modules (grpcio-tools is pinned in pyproject.toml).
proto: $(SETUP_STAMP)
	cd daemon && ../$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \
		--grpc_python_out=. ember/proto/*.proto

lint: $(SETUP_STAMP)
	$(VENV)/bin/ruff check daemon tests bench
	$(VENV)/bin/mypy

unit: $(SETUP_STAMP) fixtures
	$(PY) -m pytest -m "not bpf" -q

# Integration tests load real BPF programs: as root they are required to run
# (EMBER_REQUIRE_BPF=1), and every test is (EMBER_NO_SKIPS=1: the set-up
# installed what they use, so a skip fails the run).
test: setup fixtures lint
	root=$$( [ "$$(id -u)" = 0 ] && echo 1 || echo 0 ); \
	EMBER_REQUIRE_BPF=$$root EMBER_NO_SKIPS=$$root $(PY) -m pytest -q

# The collector and the agent on this host, profiling all of it (Ctrl-C stops).
run: setup
	EMBER=$(VENV)/bin/ember deploy/run-local.sh .ember

# The overhead benchmark suite (root; about 10 minutes): tables of ratios
# against baselines measured in the same run. Not a test: nothing is asserted.
bench: setup fixtures
	$(PY) bench/suite.py

# Builds with docker, else podman (ENGINE=podman to choose); no host set-up needed.
image:
	@engine="$(ENGINE)"; \
	if [ -z "$$engine" ]; then \
		for e in docker podman; do \
			if command -v $$e >/dev/null 2>&1; then engine=$$e; break; fi; \
		done; \
	fi; \
	if [ -z "$$engine" ] || ! command -v "$$engine" >/dev/null 2>&1; then \
		echo "make image: no container engine: install docker or podman (or set ENGINE=)" >&2; \
		exit 1; \
	fi; \
	echo "$$engine build -f deploy/Dockerfile -t $(IMAGE) ."; \
	$$engine build -f deploy/Dockerfile -t $(IMAGE) .

clean:
	$(MAKE) -s -C tests/fixtures clean
	rm -rf build dist daemon/*.egg-info .pytest_cache .mypy_cache .ruff_cache \
		deploy/web/node_modules
