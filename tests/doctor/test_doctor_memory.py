"""Memory estimate per device, checked by hand on a small config."""

from __future__ import annotations

import copy

from doctor_helpers import context
from transformers import Qwen2Config

from thinkrl.doctor import memory
from thinkrl.doctor.memory import check_device, check_host, estimate_memory

CONFIG = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
RUN = ("data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
       "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
       "data.max_prompt_length=30", "data.max_response_length=34", "data.val_batch_size=1")


def _ctx(*extra, device="cpu", **known):
    known.setdefault("param_count", 100_000)
    return context(*RUN, *extra, model_config=CONFIG, device_kind=device, **known)


def test_terms_by_hand():
    e = estimate_memory(_ctx())
    P = 100_000
    assert (e.weights, e.gradients, e.optimizer, e.reference) == (4 * P, 4 * P, 8 * P, 4 * P)
    # activations, fp32 on the CPU (c = 4): b=2, s=64, h=64, L=2, a=4, V=1000
    # per layer 2*64*64 * (34 + 5*4*64/64) = 8192 * 54 = 442368 (16-bit bytes), x 4/2 for fp32
    # logits 2*64*1000*(4+4) = 1024000
    assert e.activations == 2 * 442368 * 2 + 1024000
    # KV: 8 sequences (4 prompts x 2) x 64 tokens x 2 layers x 2 kv heads x 16 dims x 2 (k, v) x 4 bytes
    # plus sampling logits 8 x 1000 x 4
    assert e.sequences == 8
    assert e.kv_cache == 2 * 2 * 2 * 16 * 64 * 8 * 4 + 8 * 1000 * 4
    # on a CPU the device is the process: its runtime (Python, torch, libraries) counts too
    assert e.runtime == memory.RUNTIME_BYTES
    assert e.slack == memory.CPU_SLACK  # and what the allocator keeps of freed blocks
    assert e.peak == int((e.weights + e.optimizer + e.reference + e.runtime
                          + max(e.gradients + e.activations, e.kv_cache)) * 1.15)


def test_the_reference_is_counted_in_the_compute_dtype_on_an_accelerator():
    # bfloat16 compute on a GPU: the frozen reference is kept in bfloat16 (2 bytes
    # per parameter), the actor's master weights stay float32 (4)
    e = estimate_memory(_ctx("actor_rollout_ref.model.dtype=bfloat16", device="cuda"))
    P = 100_000
    assert (e.weights, e.reference) == (4 * P, 2 * P)


def test_a_critic_adds_its_weights_adamw_and_update_by_hand():
    plain = estimate_memory(_ctx())
    e = estimate_memory(_ctx("algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=1",
                             "critic.model.enable_gradient_checkpointing=False"))
    P = 100_000
    assert (e.critic, plain.critic, plain.critic_update) == (12 * P, 0, 0)  # fp32 weights + two AdamW moments
    # critic update: gradients 4P + activations of b=1 (s=64, h=64, L=2, a=4, fp32), no logits term:
    # per layer 1*64*64 * (34 + 5*4*64/64) = 221184 (16-bit bytes), x 2 layers x 4/2
    assert e.critic_update == 4 * P + 2 * 221184 * 2
    assert e.peak == int(1.15 * (e.weights + e.optimizer + e.reference + e.critic + e.runtime
                                + max(e.gradients + e.activations, e.critic_update, e.kv_cache)))
    assert abs(e.peak - plain.peak - 1.15 * 12 * P) <= 1  # the actor's update is the larger phase here
    assert "critic" in memory.FIXES and "critic update" in memory.FIXES


def test_lora_trains_the_adapter_only_and_needs_no_reference_copy_by_hand():
    # r = 8 on all seven projections of each of the 2 layers: h = 64, 4 heads of 16,
    # 2 kv heads (32 wide), intermediate 128:
    # q (64+64) + k (64+32) + v (64+32) + o (64+64) + gate, up (64+128) x 2 + down (128+64)
    # = 128 + 96 + 96 + 128 + 384 + 192 = 1024 per rank unit, x 8 x 2 layers = 16384
    e = estimate_memory(_ctx("actor_rollout_ref.model.lora_rank=8"))
    P, T = 100_000, 16_384
    assert (e.weights, e.gradients, e.optimizer, e.reference) == (4 * (P + T), 4 * T, 8 * T, 0)
    # only q and v: (128 + 96) x 8 x 2 = 3584
    e = estimate_memory(_ctx("actor_rollout_ref.model.lora_rank=8",
                             "actor_rollout_ref.model.target_modules=[q_proj,v_proj]"))
    assert (e.gradients, e.optimizer) == (4 * 3584, 8 * 3584)


def test_checkpointing_and_accelerators_shrink_activations():
    plain = estimate_memory(_ctx()).activations
    assert estimate_memory(_ctx("actor_rollout_ref.model.enable_gradient_checkpointing=True")).activations < plain
    assert estimate_memory(_ctx(device="cuda")).activations < plain  # bf16, fused attention


def test_too_little_memory_fails_naming_the_largest_term(monkeypatch):
    monkeypatch.setattr(memory, "device_capacity", lambda kind: (10 * 2**20, "test device"))
    row = check_device(_ctx(param_count=10**6))  # AdamW 8 MB of a ~23 MB peak > 10 MB
    assert row.status == "fail" and "largest: AdamW" in row.found and "smaller model" in row.fix
    monkeypatch.setattr(memory, "device_capacity", lambda kind: (int(1.1 * estimate_memory(_ctx()).peak), "x"))
    assert check_device(_ctx()).status == "warn"


def test_every_term_has_a_fix():
    assert set(memory.FIXES) == set(estimate_memory(_ctx()).terms()) - {"runtime"}  # nothing to set for it
    assert "n_gpus_per_node" in memory.FIXES["weights"] and "FSDP2" in memory.FIXES["AdamW"]
    assert "enable_gradient_checkpointing=True" in memory.FIXES["activations"]
    assert "log_prob_micro_batch_size_per_gpu" in memory.FIXES["activations"]
    assert "rollout.n" in memory.FIXES["KV cache"] and "max_num_seqs" in memory.FIXES["KV cache"]


def test_kv_bound_runs_are_told_to_generate_fewer_sequences(monkeypatch):
    monkeypatch.setattr(memory, "device_capacity", lambda kind: (2**20, "test device"))
    row = check_device(_ctx("actor_rollout_ref.rollout.n=64", param_count=10))
    assert "largest: KV cache" in row.found and "data.train_batch_size x" in row.fix


def test_activation_bound_runs_are_told_to_shrink_micro_batches(monkeypatch):
    monkeypatch.setattr(memory, "device_capacity", lambda kind: (2**20, "test device"))
    row = check_device(_ctx("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", param_count=10))
    assert "largest: activations" in row.found and "ppo_micro_batch_size_per_gpu" in row.fix


def test_host_ram_on_an_accelerator_counts_loading_and_offload(monkeypatch):
    monkeypatch.setattr(memory, "host_available", lambda: 10 * 2**30)
    ok_row = check_host(_ctx(device="cuda", param_count=10**9))  # 4 GB to load
    assert ok_row.status == "ok"
    monkeypatch.setattr(memory, "host_available", lambda: 2 * 2**30)
    local = check_host(_ctx(device="cuda", param_count=10**9))
    assert local.status == "fail" and "smaller model" in local.fix and "offload" not in local.fix
    monkeypatch.setattr(memory, "host_available", lambda: 10 * 2**30)
    row = check_host(_ctx("trainer.backend=ray", "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
                          device="cuda", param_count=10**9))
    # FSDP2's CPUOffloadPolicy moves weights, gradients and AdamW together: + 16 GB
    assert row.status == "fail" and "offloaded actor weights, gradients and AdamW 14.9 GiB" in row.found
    on_device = estimate_memory(_ctx("trainer.backend=ray", "actor_rollout_ref.actor.fsdp_config.param_offload=True",
                                     device="cuda", param_count=10**9))
    assert (on_device.weights, on_device.gradients, on_device.optimizer) == (0, 0, 0)


def test_native_engine_on_shards_gathers_the_whole_model_for_the_rollout():
    one = estimate_memory(_ctx())
    two = estimate_memory(_ctx("trainer.backend=ray", "trainer.n_gpus_per_node=2"))
    P = 100_000
    assert (one.gathered_weights, two.gathered_weights) == (0, 4 * P)  # fp32 on a CPU
    assert two.weights == 2 * P  # the trainer's state is sharded
    assert two.phases["rollout"] == two.kv_cache + 4 * P


def test_vllm_share_sleeps_through_the_updates_on_cuda_only():
    overrides = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
                 "actor_rollout_ref.rollout.update_weights_bucket_megabytes=64")
    gib80 = 80 * 2**30
    e = estimate_memory(_ctx(*overrides, device="cuda"), capacity=gib80)
    assert (e.vllm_share, e.kv_cache, e.weight_sync) == (int(0.4 * gib80), 0, 64 * 2**20)
    assert e.phases["rollout"] == e.vllm_share + e.weight_sync
    assert e.phases["update"] == e.gradients + e.activations  # asleep during the update
    awake = estimate_memory(_ctx(*overrides, "actor_rollout_ref.rollout.free_cache_engine=False",
                                 device="cuda"), capacity=gib80)
    assert awake.phases["update"] == awake.gradients + awake.activations + awake.vllm_share
    assert awake.peak == awake.resident + max(awake.phases.values())


def test_host_counts_the_weights_of_sleeping_vllm_engines(monkeypatch):
    monkeypatch.setattr(memory, "host_available", lambda: 100 * 2**30)
    row = check_host(_ctx("trainer.backend=ray", "trainer.n_gpus_per_node=2",
                          "actor_rollout_ref.rollout.name=vllm", device="cuda", param_count=10**9))
    assert "offloaded sleeping vLLM weights 3.7 GiB" in row.found  # 2 engines x 2 bytes x 1e9


def test_a_vllm_share_too_small_for_its_own_weights_fails(monkeypatch):
    monkeypatch.setattr(memory, "device_capacity", lambda kind: (10 * 2**30, "test device"))
    run = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.1",
           "actor_rollout_ref.model.dtype=bfloat16")
    row = check_device(_ctx(*run, device="cuda", param_count=10**9))  # 2 GB of bf16 weights, 1 GiB share
    assert row.status == "fail" and "holds not even its weights" in row.found
    assert "tensor_model_parallel_size" in row.fix


def test_a_lora_critic_holds_the_frozen_base_and_trains_its_adapters_and_head_by_hand():
    # T' = the actor-style adapter count (16384 at r = 8, test above) + the value head (h = 64)
    e = estimate_memory(_ctx("algorithm.adv_estimator=gae", "critic.model.lora_rank=8",
                             "critic.ppo_micro_batch_size_per_gpu=1",
                             "critic.model.enable_gradient_checkpointing=False"))
    P, T = 100_000, 16_384 + 64
    assert e.critic == 4 * P + 12 * T
    assert e.critic_update == 4 * T + 2 * 221184 * 2


def test_the_shared_prompt_pass_by_hand():
    """use_remove_padding on a plain decoder: prompts once, responses beside them."""
    # h=64, f=128, kv=32, P=30, R=34, b=4 responses of U=2 prompts, 2 layers, V=1000, fp32
    # per response token (10*64 + 4*128 + 2*32) * 4 = 1216 * 4; per row 2*32*(30+34)*4 of prompt keys
    response = 4 * 34 * 1216 * 4 + 4 * 2 * 32 * 64 * 4
    prompt = 2 * 30 * 1216 * 4
    head = 4 * 34 * 1000 * (4 + 12)
    got = memory.shared_prompt_activations(b=4, prompts=2, p=30, r=34, h=64, f=128, kv=32, layers=2,
                                           vocab=1000, c=4, checkpointing=False, fused_head=False)
    assert got == 2 * (response + prompt) + head
    checkpointed = memory.shared_prompt_activations(b=4, prompts=2, p=30, r=34, h=64, f=128, kv=32, layers=2,
                                                    vocab=1000, c=4, checkpointing=True, fused_head=False)
    assert checkpointed == 2 * (2 * 30 + 4 * 34) * 64 * 4 + 2 * (response + prompt) + head
    e = estimate_memory(_ctx("actor_rollout_ref.model.use_remove_padding=True"))
    assert e.activations == memory.shared_prompt_activations(
        b=2, prompts=2, p=30, r=34, h=64, f=128, kv=32, layers=2, vocab=1000, c=4, checkpointing=False,
        fused_head=False)


def test_distillation_teachers_are_held_like_the_reference_by_hand(tmp_path):
    # a teacher whose config.json reads: its own parameter count; one that does not: the policy's
    from thinkrl.doctor.context import estimate_param_count

    teacher = Qwen2Config(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    teacher.save_pretrained(tmp_path / "teacher")
    P, T = 100_000, estimate_param_count(teacher)
    on = ("distillation.enabled=True", f"distillation.teacher_models.teacher_model.model_path={tmp_path / 'teacher'}")
    e = estimate_memory(_ctx(*on))
    assert (e.reference, e.teachers) == (4 * P, 4 * T)  # the tiny recipe's KL loss keeps its reference
    two = estimate_memory(_ctx(*on, "+distillation.teacher_models.teacher_model.key=a",
                               "+distillation.teacher_models.b.key=b",
                               "+distillation.teacher_models.b.model_path=builtin:not-built"))
    assert two.teachers == 4 * T + 4 * P
    pure = estimate_memory(_ctx(*on, "distillation.distillation_loss.use_task_rewards=False", device="cuda"))
    assert pure.reference == 0 and pure.teachers == 2 * T  # no KL loss: no reference; bf16 on a GPU
    assert estimate_memory(_ctx()).teachers == 0


def test_a_mixture_of_experts_counts_its_active_experts_and_routing_by_hand():
    from transformers import Qwen3MoeConfig

    from thinkrl.doctor.activations import mlp_terms

    # 4 layers, layer 1 dense: 3 sparse layers of 8 experts, 2 active of width 16, beside a dense MLP of 128
    moe = Qwen3MoeConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
                         moe_intermediate_size=16, mlp_only_layers=[1])
    # f: (3 x 2 x 16 + 1 x 128) / 4 = 56; routing: 3 x (2 x 2 x 64 + 3 x 8) / 4 = 210
    assert mlp_terms(moe) == (56, 210)
    assert mlp_terms(CONFIG) == (128, 0)  # dense: its MLP, nothing routed
    twin = copy.deepcopy(moe)
    twin.num_experts = 0  # the same model without experts

    def activations(config) -> int:
        return estimate_memory(context(*RUN, model_config=config, device_kind="cpu",
                                       param_count=100_000)).activations
    # the padded formula (use_remove_padding off): routing adds 2 b s x 210 16-bit elements per
    # layer (b = 2, s = 64), 4 layers, in fp32 here (x 4/2)
    assert activations(moe) - activations(twin) == 4 * (2 * 2 * 64 * 210) * 4 // 2
