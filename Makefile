# make train: install what is missing, prepare the default data if needed, train model=small with recipe=modern
#             (the best of this framework's recipes) on a 5-minute horizon: README's "The default run".
#             `make train QUICK=` trains the longer run instead (TrainConfig's defaults: 1,600 steps of 32 x 128).
# make test:  install the package with its test extra, run the whole test suite, in WORKERS processes (pytest-xdist,
#             one test file per worker at a time, one thread each: tests/conftest.py); WORKERS=0 runs it in this one.
# make test-fast: the same without the tests marked slow (those that start the scripts as processes).
#             Both end with the 20 slowest tests (setup, call or teardown) and their times.
PYTHON ?= python3
ARGS ?=
# The default run's 5-minute horizon (README's "The default run"): model=small narrowed to 96 wide (0.49M parameters,
# 1.5x the tokens per second of 128 wide), 900 steps of 32 x 128 characters, a WSD schedule for that horizon (30 steps
# of warmup, then stable, then a linear decay to zero over the second half) and evaluations at the start, halfway and
# the end. Every other setting is TrainConfig's.
QUICK ?= model.n_embd=96 train.max_iters=900 train.warmup_iters=30 train.decay_frac=0.5 train.min_lr=0 train.eval_interval=450
WORKERS ?= 2
PARALLEL = $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadfile)

.PHONY: train test test-fast install install-dev clean

train: install
	$(PYTHON) scripts/train.py model=small recipe=modern $(QUICK) $(ARGS)

test: install-dev
	$(PYTHON) -m pytest $(PARALLEL) --durations=20 $(ARGS)

test-fast: install-dev
	$(PYTHON) -m pytest -m "not slow" $(PARALLEL) --durations=20 $(ARGS)

# Install only when something is missing, so repeated runs cost nothing (and no network is needed). `train` looks the
# packages up without importing them (0.1 s where importing torch and the rest costs about 2 s of the 5 minutes).
install:
	@$(PYTHON) -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in \
		'gpt torch numpy tiktoken hydra tensorboard tqdm matplotlib safetensors tokenizers'.split()))" 2>/dev/null \
		|| $(PYTHON) -m pip install -e .

install-dev:
	@$(PYTHON) -c "import gpt, torch, numpy, tiktoken, hydra, tensorboard, tqdm, matplotlib, safetensors, tokenizers, \
		pytest, hypothesis, ruff, datasets, pyarrow, transformers, lm_eval, gguf, fastapi, uvicorn, jinja2, openai, selenium, peft, scipy, xdist" \
		2>/dev/null || $(PYTHON) -m pip install -e ".[dev]"

clean:
	rm -rf runs outputs multirun .pytest_cache
