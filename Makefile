# Two commands do all the set-up on a fresh machine with Python 3.11:
#   make demo   install, then run the built-in tiny GRPO recipe (`thinkrl train`)
#   make test   install, then run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Pinned first so that no later requirement pulls a different (multi-GB CUDA)
# build; override for an accelerator machine, e.g. TORCH_SPEC='torch==2.13.0'.
TORCH_SPEC ?= torch==2.13.0
# The versions the README's demo numbers come from (empty: newest releases).
CONSTRAINTS ?= constraints.txt
PIN := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))

.PHONY: install demo test bench clean

$(BIN)/thinkrl: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check $(PIN) $(TORCH_SPEC)
	$(BIN)/pip install -q --disable-pip-version-check $(PIN) -e '.[dev]'
	touch $@

install: $(BIN)/thinkrl

# The tiny recipe, keeping its last step's checkpoint (for thinkrl eval / export).
demo: install
	$(BIN)/thinkrl train --config tiny trainer.save_freq=40

test: install
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python bench/grpo_step.py

clean:
	rm -rf $(VENV) runs .pytest_cache
