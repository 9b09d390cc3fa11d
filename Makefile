# make train: install what is missing, prepare the default data if needed, train model=small.
# make test:  install the package with its test extra, run the test suite.
PYTHON ?= python3
ARGS ?=

.PHONY: train test install install-dev clean

train: install
	$(PYTHON) scripts/train.py model=small $(ARGS)

test: install-dev
	$(PYTHON) -m pytest $(ARGS)

# Install only when something is missing, so repeated runs cost nothing (and no network is needed).
install:
	@$(PYTHON) -c "import gpt, torch, numpy, tiktoken, hydra, tensorboard, tqdm, matplotlib, safetensors" 2>/dev/null \
		|| $(PYTHON) -m pip install -e .

install-dev:
	@$(PYTHON) -c "import gpt, torch, numpy, tiktoken, hydra, tensorboard, tqdm, matplotlib, safetensors, pytest, hypothesis" 2>/dev/null \
		|| $(PYTHON) -m pip install -e ".[dev]"

clean:
	rm -rf runs outputs multirun .pytest_cache
