# The two commands a newcomer needs: `make demo` (the main job) and `make test` (every test).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# Debian packages the tests drive for real: Prometheus and promtool, headless Chromium, and g++ to
# compile FlashInfer's own workspace-layout C++ for the sizing cross-check.
SYSTEM_TOOLS := promtool prometheus chromium g++
# Every install is `<venv>/bin/python -m pip`: the venv the python belongs to, even in a copied venv whose
# bin/pip still names the original's python (a reinstall would land there, and the tests run the old code).

.PHONY: setup system-deps service-venv sglang-venv demo test test-setup

$(BIN)/capwatch: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The local CPU wheel first, so nothing below can pull a CUDA build of torch.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[all]"
	touch $@

setup: $(BIN)/capwatch

# The tests also check the FlashInfer adapters against the real package (import level, no GPU).
$(VENV)/.test-deps: $(BIN)/capwatch
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[all,flashinfer]"
	# 0.7.4 cannot share a venv with 0.7.2.post1: its wheel is checked from source (ast), unpacked.
	$(BIN)/python -m pip download -q --no-deps flashinfer-python==0.7.4 -d .whl
	# The DeepEP builds SGLang pins (0.5.19 - 0.5.21, 0.5.22 - 0.5.23): their compiled size functions check
	# capwatch's DeepEP sizing (tests/sizing/test_against_deepep.py), run in the sglang venv.
	$(BIN)/python -m pip download -q --no-deps sgl-deep-ep==0.1.2 -d .whl
	$(BIN)/python -m pip download -q --no-deps sgl-deep-ep==0.1.2.post1 -d .whl
	touch $@

# A monitoring box's install: `.[service]` alone, non-editable, in a clean venv, so a test can show that
# `capwatch serve` and `capwatch plan` run with torch absent. The project itself is reinstalled every
# time (it is what the test is about); its dependencies only when pyproject or the pins change.
SERVICE_VENV := .venv-service
$(SERVICE_VENV)/.deps: pyproject.toml constraints.txt | $(VENV)/.test-deps
	$(PYTHON) -m venv $(SERVICE_VENV)
	$(SERVICE_VENV)/bin/python -m pip install -q --upgrade pip
	$(SERVICE_VENV)/bin/python -m pip install -q -c constraints.txt ".[service]"
	touch $@

# build/ goes first: setuptools builds the wheel there and keeps what it held, so a module deleted from the
# checkout would still be installed (and the tests' stale-install check would refuse the venv).
service-venv: $(SERVICE_VENV)/.deps
	rm -rf build
	$(SERVICE_VENV)/bin/python -m pip install -q --no-deps --force-reinstall .

# The SGLang plugin's tests run each verified release's released code (0.5.19 - 0.5.23) on CPU.
# One venv holds one dependency set, 0.5.22 - 0.5.23's pins: sglang pins torch==2.14.1, and that CUDA
# build (on this machine's disk) runs on the CPU, with the torchvision whose operators match (PyPI's
# torchvision fails to import beside the CPU torch 2.13 wheel). torch first, so nothing below can pull
# another; then what sglang's imports need (flashinfer-python for its dependencies: it is removed again,
# each release brings its own pin). Each release adds folders on PYTHONPATH (tests/sglang/releases.py:
# its sglang wheel --no-deps, its FlashInfer pin, its own transformers/xgrammar pins), each installed once; and
# folders no release pins (flashinfer-python 0.7.4, which no release's FlashinferDispatcher can be built with).
# capwatch last, for its sglang.srt.plugins entry point.
SGLANG_VENV := .venv-sglang
SGLANG_PINS := tests/sglang/constraints.txt
SGLANG_RELEASES := .sglang-releases
SGLANG_IMPORTS := flashinfer-python transformers orjson psutil pybase64 msgspec pyzmq aiohttp ipython dill \
	sentencepiece compressed-tensors gguf setproctitle openai partial-json-parser uvicorn fastapi \
	prometheus-client httpx
$(SGLANG_VENV)/.deps: $(SGLANG_PINS)
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/python -m pip install -q --upgrade pip
	$(SGLANG_VENV)/bin/python -m pip install -q -c $(SGLANG_PINS) torch torchvision
	$(SGLANG_VENV)/bin/python -m pip install -q -c $(SGLANG_PINS) $(SGLANG_IMPORTS)
	$(SGLANG_VENV)/bin/python -m pip uninstall -q -y flashinfer-python
	touch $@

$(SGLANG_RELEASES)/.installed: $(SGLANG_VENV)/.deps tests/sglang/releases.py
	$(SGLANG_VENV)/bin/python -m tests.sglang.releases install $(SGLANG_RELEASES)
	touch $@

sglang-venv: $(SGLANG_VENV)/.deps $(SGLANG_RELEASES)/.installed | service-venv
	$(SGLANG_VENV)/bin/python -m pip install -q --no-deps -e .

system-deps:
	@missing=""; for tool in $(SYSTEM_TOOLS); do command -v $$tool >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus chromium g++; \
	fi

demo: setup
	$(BIN)/capwatch demo --state-dir state

# Everything the tests need, built side by side (make -j): the SGLang venv and its release folders (torch
# 2.14.1 and five releases, the longest part) and the system packages need nothing from the others. Each step
# that builds capwatch from this folder (setuptools writes build/ and the egg-info here) waits for the one
# before it (the order-only prerequisites above): .venv, its test extras, .venv-service, then .venv-sglang.
test-setup: $(VENV)/.test-deps system-deps service-venv sglang-venv

test:
	$(MAKE) -j4 --output-sync=target test-setup
	CAPWATCH_REQUIRE_FLASHINFER=0.7.4 CAPWATCH_REQUIRE_DEEPEP=1 CAPWATCH_REQUIRE_SERVICE_VENV=1 \
	CAPWATCH_REQUIRE_SGLANG_VENV=1 $(BIN)/python -m pytest
