# make train: install what is missing, prepare the default data if needed, train model=small with recipe=modern
#             (the best of this framework's recipes on the default run: README's "The default run").
# make test:  install the package with its test extra, run the whole test suite, in WORKERS processes (pytest-xdist,
#             one test file per worker at a time, one thread each: tests/conftest.py); WORKERS=0 runs it in this one.
# make test-fast: the same without the tests marked slow (those that start the scripts as processes).
#             Both end with the 20 slowest tests (setup, call or teardown) and their times.
PYTHON ?= python3
ARGS ?=
WORKERS ?= 2
PARALLEL = $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadfile)

.PHONY: train test test-fast install install-dev clean

train: install
	$(PYTHON) scripts/train.py model=small recipe=modern $(ARGS)

test: install-dev
	$(PYTHON) -m pytest $(PARALLEL) --durations=20 $(ARGS)

test-fast: install-dev
	$(PYTHON) -m pytest -m "not slow" $(PARALLEL) --durations=20 $(ARGS)

# Install only when something is missing, so repeated runs cost nothing (and no network is needed).
install:
	@$(PYTHON) -c "import gpt, torch, numpy, tiktoken, hydra, tensorboard, tqdm, matplotlib, safetensors, tokenizers" 2>/dev/null \
		|| $(PYTHON) -m pip install -e .

install-dev:
	@$(PYTHON) -c "import gpt, torch, numpy, tiktoken, hydra, tensorboard, tqdm, matplotlib, safetensors, tokenizers, \
		pytest, hypothesis, ruff, datasets, pyarrow, transformers, lm_eval, gguf, fastapi, uvicorn, jinja2, openai, selenium, peft, scipy, xdist" \
		2>/dev/null || $(PYTHON) -m pip install -e ".[dev]"

clean:
	rm -rf runs outputs multirun .pytest_cache
