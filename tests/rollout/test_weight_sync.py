"""Weight sync into an engine that holds its own copy, and the vLLM engine's
plumbing, without vLLM: a fake `LLM` records what it is given.

The real engine is tested in tests/rollout/test_vllm_engine.py (needs the extra).
"""

import sys
import types

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from test_native import prompt_batch  # the same left-padded batches as the native tests
from thinkrl.config import Config
from thinkrl.errors import SetupError
from thinkrl.records import FINISH_LENGTH, FINISH_STOP
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.native import NativeEngine
from thinkrl.rollout.vllm_checks import check_vllm_usable
from thinkrl.rollout.vllm_engine import VllmEngine, engine_arguments, to_rollouts
from thinkrl.rollout.weight_sync import buckets, full_state_tensors, layer_of

MB = 2**20


def t(megabytes: float) -> torch.Tensor:
    return torch.zeros(int(megabytes * MB) // 4)  # float32


def test_layer_of_groups_a_decoder_layer_and_keeps_other_modules_apart():
    assert layer_of("model.layers.3.self_attn.q_proj.weight") == "model.layers.3"
    assert layer_of("model.layers.3.mlp.up_proj.weight") == "model.layers.3"
    assert layer_of("model.layers.12.input_layernorm.weight") == "model.layers.12"
    assert layer_of("model.embed_tokens.weight") == "model.embed_tokens"
    assert layer_of("lm_head.weight") == "lm_head"


def test_buckets_close_at_the_first_layer_boundary_past_the_size():
    named = [("model.embed_tokens.weight", t(3)),
             ("model.layers.0.q.weight", t(1)), ("model.layers.0.k.weight", t(1)),
             ("model.layers.1.q.weight", t(1)), ("model.layers.1.k.weight", t(1)),
             ("model.layers.1.v.weight", t(1)),
             ("model.norm.weight", t(0.5)), ("lm_head.weight", t(3))]
    got = [[name for name, _ in bucket] for bucket in buckets(named, megabytes=2)]
    # embed (3 MB) reaches 2 MB alone; layer 0 (2 MB) fills the second; layer 1
    # (3 MB) is never split although it passes 2 MB after its second tensor.
    assert got == [["model.embed_tokens.weight"],
                   ["model.layers.0.q.weight", "model.layers.0.k.weight"],
                   ["model.layers.1.q.weight", "model.layers.1.k.weight", "model.layers.1.v.weight"],
                   ["model.norm.weight", "lm_head.weight"]]
    assert [name for b in buckets(named, megabytes=1000) for name, _ in b] == [n for n, _ in named]
    assert list(buckets([], megabytes=1)) == []


def tiny_model(tied: bool) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg)


def test_full_state_tensors_name_tied_weights_under_both_names_and_share_storage():
    model = tiny_model(tied=True)
    named = dict(full_state_tensors(model))
    assert set(named) == set(model.state_dict())
    assert "lm_head.weight" in named and "model.embed_tokens.weight" in named
    assert named["lm_head.weight"].data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert all(not v.requires_grad for v in named.values())


class FakeLLM:
    """Records reloads (what vLLM's collective_rpc('reload_weights') is given)."""

    def __init__(self):
        self.reloads: list[list[str]] = []
        self.received: dict[str, torch.Tensor] = {}
        self.prefix_cache_resets = 0
        self.calls: list[str] = []
        # What the engine's attestation reads: the dtype it holds weights in, its fused tensors.
        self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(dtype=torch.float32))

    def apply_model(self, func):
        return [func(torch.nn.Module())]  # a model without fused tensors

    def collective_rpc(self, method, kwargs):
        assert method == "reload_weights"
        bucket = list(kwargs["weights_iterator"])
        self.reloads.append([name for name, _ in bucket])
        self.received.update({name: tensor.clone() for name, tensor in bucket})
        self.calls.append("reload")

    def reset_prefix_cache(self):
        self.prefix_cache_resets += 1
        self.calls.append("reset")
        return True

    def sleep(self, level):
        self.calls.append(f"sleep{level}")

    def wake_up(self, tags):
        self.calls.append("wake:" + ",".join(sorted(tags)))


def test_update_weights_streams_every_tensor_in_whole_layer_buckets_then_resets_the_prefix_cache():
    model = tiny_model(tied=True)
    fake = FakeLLM()
    engine = VllmEngine(fake, eos_token_ids=[1], pad_token_id=0, seed=0,
                        bucket_megabytes=0.01, sleep_mode=False)  # ~10 KB: several buckets
    engine.update_weights(full_state_tensors(model))
    state = model.state_dict()
    assert set(fake.received) == set(state)
    for name, tensor in state.items():
        assert torch.equal(fake.received[name], tensor), name
    assert len(fake.reloads) > 2
    for bucket in fake.reloads:  # a decoder layer never spans two buckets
        for other in fake.reloads:
            if other is not bucket:
                assert not {layer_of(n) for n in bucket if ".layers." in n} & \
                           {layer_of(n) for n in other if ".layers." in n}
    assert fake.calls[-1] == "reset" and fake.prefix_cache_resets == 1


def test_sleep_mode_wakes_weights_for_the_sync_and_the_cache_for_the_rollout():
    fake = FakeLLM()
    engine = VllmEngine(fake, eos_token_ids=[1], pad_token_id=0, seed=0,
                        bucket_megabytes=512, sleep_mode=True)
    engine._sleep()
    engine.update_weights(full_state_tensors(tiny_model(tied=False)))
    engine._wake("weights", "kv_cache")
    assert fake.calls == ["sleep1", "wake:weights", "reload", "reset", "wake:kv_cache"]


def test_to_rollouts_pads_right_masks_the_stop_token_and_groups_responses():
    batch = prompt_batch([[5, 6, 7], [8]])
    completions = [[([10, 11, 1], [-0.5, -1.0, -0.25], "stop"), ([12], [-2.0], "stop")],
                   [([13, 14, 15, 16], [-0.1, -0.2, -0.3, -0.4], "length"),
                    ([17, 1], [-1.5, -0.75], "stop")]]
    r = to_rollouts(batch, completions, params=SamplingParams(n=2, max_tokens=4), pad_token_id=0)
    assert r.response_ids.tolist() == [[10, 11, 1, 0], [12, 0, 0, 0], [13, 14, 15, 16], [17, 1, 0, 0]]
    assert r.response_mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]
    torch.testing.assert_close(r.rollout_logprobs, torch.tensor(
        [[-0.5, -1.0, -0.25, 0.0], [-2.0, 0, 0, 0], [-0.1, -0.2, -0.3, -0.4], [-1.5, -0.75, 0, 0]]))
    assert r.rollout_logprobs.dtype == torch.float32
    assert r.finish_reasons == [FINISH_STOP, FINISH_STOP, FINISH_LENGTH, FINISH_STOP]
    assert r.group_ids.tolist() == [0, 0, 1, 1]
    assert torch.equal(r.prompt_ids, batch.input_ids.repeat_interleave(2, 0))
    assert [s.index for s in r.samples] == [0, 0, 1, 1]


def test_engine_arguments_map_verl_keys_and_pass_engine_kwargs_through():
    cfg = Config()
    rollout = cfg.actor_rollout_ref.rollout
    rollout.tensor_model_parallel_size, rollout.gpu_memory_utilization = 4, 0.6
    rollout.engine_kwargs = {"vllm": {"swap_space": 2, "enforce_eager": True}}
    args = engine_arguments(cfg, model_path="/m", max_model_len=1536, seed=7, device_kind="cuda")
    assert args["model"] == "/m" and args["tensor_parallel_size"] == 4
    assert args["gpu_memory_utilization"] == 0.6 and args["max_model_len"] == 1536
    assert args["load_format"] == "dummy"  # verl's dummy_dtensor: the first sync loads the weights
    assert args["enable_sleep_mode"] is True and args["enable_chunked_prefill"] is True
    assert args["swap_space"] == 2 and args["enforce_eager"] is True  # the user's choice wins
    assert args["skip_tokenizer_init"] and args["logprobs_mode"] == "processed_logprobs"
    cpu = engine_arguments(cfg, model_path="/m", max_model_len=1536, seed=7, device_kind="cpu")
    assert cpu["enable_sleep_mode"] is False and cpu["enable_chunked_prefill"] is False


def test_the_engine_computes_in_the_trainers_dtype_unless_told_otherwise():
    # verl's default rollout dtype bfloat16 beside a float32 trainer on a CPU
    # gave a log-prob gap of ~1e-3 nats per token (docs/benchmarks.md).
    cfg = Config()

    def dtype(kind):
        return engine_arguments(cfg, model_path="/m", max_model_len=64, seed=0, device_kind=kind)["dtype"]

    assert (dtype("cpu"), dtype("cuda")) == ("float32", "bfloat16")
    cfg.actor_rollout_ref.model.dtype = "float16"
    assert (dtype("cpu"), dtype("cuda")) == ("float16", "float16")
    cfg.actor_rollout_ref.rollout.dtype = "bfloat16"  # an explicit choice wins
    assert dtype("cpu") == "bfloat16"


def test_asking_for_vllm_without_it_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(SetupError, match=r"pip install -e '\.\[vllm\]'"):
        check_vllm_usable("cpu")


def test_vllm_on_an_npu_needs_the_plain_weight_layout(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    with pytest.raises(SetupError, match="VLLM_ASCEND_ENABLE_NZ=0"):
        check_vllm_usable("npu", env={})
    check_vllm_usable("npu", env={"VLLM_ASCEND_ENABLE_NZ": "0"})
    check_vllm_usable("cuda", env={})


def test_native_engine_takes_state_dict_names_and_copies_only_foreign_tensors():
    model = tiny_model(tied=True)
    engine = NativeEngine(model, eos_token_ids=[1], pad_token_id=0)
    engine.update_weights(full_state_tensors(model))  # its own tensors: nothing to copy
    other = tiny_model(tied=True)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    engine.update_weights(full_state_tensors(other))
    for name, tensor in other.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


def test_stale_cpu_shm_of_this_ranks_tp_group_is_removed_and_nothing_else(tmp_path):
    from thinkrl.rollout.vllm_engine import remove_stale_cpu_shm
    names = ["-tp:0-[0-1]-cpushm_0", "-tp:0-[0-1]-cpushm_1", "x-tp:1-[2-3]-cpushm_0",
             "psm_a2bdc10c", "-tp:0-[0-1-2-3]-cpushm_1"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    removed = remove_stale_cpu_shm(1, 2, folder=str(tmp_path))  # rank 1 of group [0, 1]
    assert [p.rsplit("/", 1)[1] for p in removed] == ["-tp:0-[0-1]-cpushm_1"]
    assert remove_stale_cpu_shm(2, 2, folder=str(tmp_path))[0].endswith("x-tp:1-[2-3]-cpushm_0")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["-tp:0-[0-1]-cpushm_0", "psm_a2bdc10c", "-tp:0-[0-1-2-3]-cpushm_1"])


def test_the_choice_between_adapter_and_merged_weights_is_stated(monkeypatch, tmp_path):
    import json

    from thinkrl.config import load_config
    from thinkrl.rollout import vllm_lora

    def choice(*overrides):
        cfg = load_config("tiny", ["actor_rollout_ref.rollout.name=vllm",
                                   "actor_rollout_ref.model.lora_rank=8", *overrides])
        return vllm_lora.adapter_serving(cfg)

    monkeypatch.setattr(vllm_lora, "_vllm_release", lambda: (0, 32))
    assert choice()[0] and "serves the adapter itself" in choice()[1]
    assert choice("actor_rollout_ref.model.lora.merge=True") == (
        False, "LoRA with rollout.name=vllm: the engine is sent the base with the adapter merged in "
               "(W + s B A) after every update (actor_rollout_ref.model.lora.merge=True)")
    assert not choice("actor_rollout_ref.model.lora_rank=1024")[0]
    assert not choice("+actor_rollout_ref.rollout.engine_kwargs.vllm.fully_sharded_loras=True")[0]
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "rank_pattern": {"q_proj": 4}}))
    assert "rank_pattern" in choice(f"actor_rollout_ref.model.lora_adapter_path={tmp_path}",
                                    "actor_rollout_ref.model.lora_alpha=16")[1]
    monkeypatch.setattr(vllm_lora, "_vllm_release", lambda: (0, 16))
    assert choice() == (False, "LoRA with rollout.name=vllm: the engine is sent the base with the adapter "
                               "merged in (W + s B A) after every update: serving the adapter itself is "
                               "built on vLLM 0.32+ (here: 0.16)")
    assert vllm_lora.engine_lora_arguments(12)["max_lora_rank"] == 16
