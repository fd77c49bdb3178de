"""Shared fixtures: a quickly pretrained tiny model and a private asset cache."""

from __future__ import annotations

import os
from pathlib import Path

# Ray reads this when it is first imported: with it, every Ray process in the
# tests binds 127.0.0.1 and nothing else (also set by .ci/run).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def pytest_addoption(parser) -> None:
    parser.addoption("--deterministic", action="store_true",
                     help="run with torch.use_deterministic_algorithms(True) (in this process)")


def pytest_configure(config) -> None:
    if config.getoption("--deterministic"):
        torch.use_deterministic_algorithms(True)


@pytest.fixture(scope="session")
def asset_cache(tmp_path_factory) -> Path:
    """THINKRL_CACHE for the whole session, so tests never touch ~/.cache."""
    path = tmp_path_factory.mktemp("thinkrl-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("THINKRL_CACHE", str(path))
    yield path
    mp.undo()


def pretrained_tiny(folder: Path, *, pretrain_steps: int = 15) -> Path:
    """The test model's recipe (a tiny Qwen2, its tokenizer trained on the same
    400 problems whatever the steps) pretrained `pretrain_steps` steps into `folder`."""
    from thinkrl.models.tiny import TinyModelSpec, build_tiny_model

    spec = TinyModelSpec(hidden_size=64, intermediate_size=128, num_layers=2,
                         pretrain_problems=400, pretrain_steps=pretrain_steps, batch_size=16)
    torch_threads = torch.get_num_threads()
    out = build_tiny_model(folder, spec, log=lambda *_: None)
    torch.set_num_threads(torch_threads)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny Qwen2 model after a few pretraining steps (seconds, not minutes):
    good enough to exercise every stage, not to learn the task."""
    return pretrained_tiny(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def calc_model_dir(tmp_path_factory) -> Path:
    """A small model of the calculator task that always calls the calculator
    first (tool_rate 1): it writes real tool calls and stops at uneven lengths."""
    from thinkrl.models.tiny_calc import CalcModelSpec, build_calc_model

    spec = CalcModelSpec(hidden_size=64, intermediate_size=128, num_layers=2, pretrain_problems=300,
                         pretrain_steps=200, batch_size=16, tool_rate=1.0)
    torch_threads = torch.get_num_threads()
    out = build_calc_model(tmp_path_factory.mktemp("models") / "calc", spec, log=lambda *_: None)
    torch.set_num_threads(torch_threads)
    return out


@pytest.fixture
def tiny_run(asset_cache, tiny_model_dir, tmp_path):
    """Overrides that point the tiny recipe at the test model and a temp run dir."""
    return [f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"trainer.default_local_dir={tmp_path / 'run'}"]


QWEN_TOKENIZER = SHARED_DATA / "tokenizers" / "qwen2.5"


@pytest.fixture(scope="session")
def tiny_vl_dir(tmp_path_factory) -> Path:
    """A tiny Qwen2.5-VL folder (random weights, the real Qwen2.5 tokenizer,
    a Qwen2-VL image processor); skips without ../shared/data."""
    if not (QWEN_TOKENIZER / "vocab.json").is_file():
        pytest.skip("../shared/data (the Qwen2.5 tokenizer) is absent")
    from thinkrl.models.tiny_vl import build_tiny_vl
    return build_tiny_vl(tmp_path_factory.mktemp("models") / "tiny-vl", tokenizer_dir=QWEN_TOKENIZER)


@pytest.fixture(scope="module")
def spec_and_tokenizer(tiny_model_dir):
    """The rollout side's spec and tokenizer on the tiny test model, for tests
    that build a rollout server or engine without a run."""
    from thinkrl.assets import run_tokenizer
    from thinkrl.cli import recipe_path
    from thinkrl.config import load_config
    from thinkrl.config.checks import validate
    from thinkrl.workers.policy_rank import RankSpec

    cfg = load_config(recipe_path("tiny"), [f"actor_rollout_ref.model.path={tiny_model_dir}"])
    tokenizer = run_tokenizer(cfg, str(tiny_model_dir))
    return RankSpec.of_model(cfg, validate(cfg), str(tiny_model_dir), tokenizer, total_steps=1), tokenizer
