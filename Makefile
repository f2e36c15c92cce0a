# The README's two commands: `make demo` and `make test`. Both set up
# everything they need on a fresh Debian/Ubuntu machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
GO_PKGS := golang-go golang-github-hashicorp-go-plugin-dev golang-google-grpc-dev \
  golang-goprotobuf-dev protobuf-compiler golang-github-zclconf-go-cty-dev \
  golang-github-hashicorp-hcl-v2-dev golang-github-hashicorp-go-version-dev golang-github-hashicorp-hcl-dev

.PHONY: lock demo test venv go-deps go-tools lint typecheck pytest protos dist bench clean mutate promtool

# Every install goes through requirements.lock (exact versions; `make lock` refreshes it on
# purpose). PIP_CONSTRAINT reaches pip's isolated build environment too, so setuptools is pinned.
LOCK := $(CURDIR)/requirements.lock
$(BIN)/.installed: pyproject.toml requirements.lock
	$(PY) -m venv $(VENV)
	PIP_CONSTRAINT=$(LOCK) $(BIN)/pip install -q --disable-pip-version-check pip setuptools
	PIP_CONSTRAINT=$(LOCK) $(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

# Resolve today's newest releases into requirements.lock; review the diff, fix what they break.
lock:
	$(PY) tools/lock.py

demo: venv
	$(BIN)/nomad-device-lingjun demo

# Go and HashiCorp's go-plugin library from Debian, for the conformance host.
go-deps:
	@if ! command -v go >/dev/null || [ ! -d /usr/share/gocode/src/github.com/hashicorp/go-plugin ] || [ ! -d /usr/share/gocode/src/github.com/hashicorp/go-version ] || [ ! -f /usr/share/gocode/src/github.com/hashicorp/hcl/decoder.go ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(GO_PKGS) >/dev/null; \
	  else echo "conformance host needs: sudo apt-get install $(GO_PKGS)"; exit 1; fi; fi

# The Go programs the tests run: the conformance host with its compiled Go unit tests, and the
# jobspec oracle. Built here, before pytest starts: a fixture only checks that they are current (a
# cold Go build on a loaded box outlasts any test's timeout). Each build script keeps a stamp of its
# sources and Go's version and rebuilds only when one changed; Go's build cache lives in their bin/.
go-tools: venv go-deps
	$(BIN)/python tests/conformance/build.py >/dev/null
	$(BIN)/python tests/jobspec/oracle/build.py >/dev/null

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

# tests/operator/test_dist.py runs the shipped executable (CI fails it when missing).
pytest: venv go-tools dist promtool
	$(BIN)/pytest -q

test: lint typecheck pytest

# Mutation testing of the critical modules (mutmut; not in CI, tens of minutes
# on two cores). MODULES=nomad/fingerprint,config/decode runs a subset; it prints the
# table of killed/survived/equivalent per module.
MODULES ?=
mutate: venv
	$(BIN)/python tools/mutate.py $(MODULES)

protos: venv
	$(BIN)/python tools/gen_protos.py

# The shipped executable: dist/nomad-device-lingjun and its .sha256 (tools/build_dist.py says how
# and why). Needs $(PY), PyPI and Debian's archive: its Python is built for glibc 2.17 by
# tools/build_python.py (cached in ~/.cache/nomad-device-lingjun-build), then its own small build
# venv (build/dist-venv); rebuilt when a source changes.
DIST := dist/nomad-device-lingjun
dist: $(DIST)

$(DIST): pyproject.toml requirements.lock tools/build_dist.py tools/build_python.py tools/launcher.c $(shell find nomad_plugin -name '*.py' 2>/dev/null)
	$(PY) tools/build_dist.py

# Prometheus's promtool (checks and unit-tests deploy/prometheus's alert rules): Debian's
# prometheus package, downloaded and unpacked into build/ (not installed: no service, no deps).
PROMTOOL := build/promtool/usr/bin/promtool
promtool: $(PROMTOOL)

$(PROMTOOL):
	rm -rf build/promtool.tmp && mkdir -p build/promtool.tmp
	cd build/promtool.tmp && { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus; }; }
	dpkg -x build/promtool.tmp/prometheus_*.deb build/promtool.tmp/x
	mkdir -p $(dir $@) && cp build/promtool.tmp/x/usr/bin/promtool $@ && rm -rf build/promtool.tmp
	$@ --version | head -1

clean:
	rm -rf $(VENV) build dist tests/conformance/bin tests/jobspec/oracle/bin mutants
