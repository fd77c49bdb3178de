"""The rehearsal's sizes keep every divisibility of the real ones; its data
sample keeps every column and says where each row came from."""

from __future__ import annotations

import pyarrow.parquet as pq

from thinkrl.config.checks import validate
from thinkrl.rehearse.plan import RunArgs, sample_rows, shrunk_batch

ARR = "actor_rollout_ref"
SEED_004_SIZES = ("data.train_batch_size=512", f"{ARR}.actor.ppo_mini_batch_size=32",
                  f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2", f"{ARR}.rollout.n=5",
                  "trainer.n_gpus_per_node=8", "trainer.nnodes=1",
                  f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=4")


def test_seed_004_sizes_shrink_to_the_smallest_batch_that_splits_as_the_real_one():
    args = RunArgs(None, SEED_004_SIZES)
    real = args.load()
    sizes, note = shrunk_batch(args, real, [])
    assert note is None
    # 5 responses per prompt over 8 ranks in micro-batches of 2: 16 prompts per
    # mini-batch is the least (80 responses, 10 per rank, 5 micro-batches), 2 of them
    assert sizes == ["data.train_batch_size=32", f"{ARR}.actor.ppo_mini_batch_size=16"]
    small = validate(args.load(sizes))
    big = validate(real)
    assert small.world_size == big.world_size == 8
    assert small.micro_batch_size_per_device == big.micro_batch_size_per_device == 2
    assert small.mini_batches_per_step == 2 and big.mini_batches_per_step == 16
    assert small.responses_per_mini_batch_per_device % small.micro_batch_size_per_device == 0


def test_one_mini_batch_stays_one():
    args = RunArgs(None, ("data.train_batch_size=64", f"{ARR}.actor.ppo_mini_batch_size=64",
                          f"{ARR}.rollout.n=8", "trainer.n_gpus_per_node=4"))
    sizes, _ = shrunk_batch(args, args.load(), [])
    assert validate(args.load(sizes)).mini_batches_per_step == 1
    assert sizes == ["data.train_batch_size=1", f"{ARR}.actor.ppo_mini_batch_size=1"]


def test_the_sample_keeps_every_column_and_names_the_real_rows(tmp_path):
    import pyarrow as pa

    source = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": [f"q{i}" for i in range(50)], "answer": list(range(50)),
                             "extra": [{"k": i} for i in range(50)]}), source)
    sample = sample_rows([source], tmp_path / "sample", rows=10, seed=3)
    again = sample_rows([source], tmp_path / "again", rows=10, seed=3)
    [written] = sample.files
    table = pq.read_table(written)
    assert table.column_names == ["prompt", "answer", "extra"] and table.num_rows == 10
    assert table.to_pylist() == pq.read_table(again.files[0]).to_pylist()  # seeded
    answers = table.column("answer").to_pylist()
    assert sample.real_row(written, 3) == f"{source}, row {answers[3]}"


def test_when_only_the_real_sizes_divide_they_are_kept():
    # micro-batches of 3 responses with 2 per prompt on 2 ranks: 1 or 2 prompts per
    # mini-batch leave 1 or 2 responses per rank, which 3 does not divide
    args = RunArgs(None, ("data.train_batch_size=3", f"{ARR}.actor.ppo_mini_batch_size=3",
                          f"{ARR}.rollout.n=2", "trainer.n_gpus_per_node=2",
                          f"{ARR}.actor.ppo_micro_batch_size_per_gpu=3",
                          f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=3",
                          f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=3"))
    validate(args.load())
    sizes, note = shrunk_batch(args, args.load(), [])
    assert sizes == ["data.train_batch_size=3", f"{ARR}.actor.ppo_mini_batch_size=3"] and note is None


def test_a_response_length_the_run_refuses_stays_the_real_one():
    from thinkrl.rehearse.plan import response_overrides

    args = RunArgs("tiny", ("data.max_response_length=512",))
    keys, note = response_overrides(args, args.load(), [])
    assert keys == ["data.max_response_length=32"] and note is None
    dapo = RunArgs("tiny", ("data.max_response_length=512", "reward_model.overlong_buffer.enable=True",
                            "reward_model.overlong_buffer.len=128"))
    keys, note = response_overrides(dapo, dapo.load(), [])
    assert keys == [] and "the real 512 tokens" in note


def test_no_model_path_of_the_run_keeps_the_real_weights(tmp_path):
    from thinkrl.rehearse.plan import model_overrides

    for critic in ("/models/Qwen2.5-7B", "/models/value-7B"):  # the policy's path, or its own
        real = RunArgs("ppo", (f"{ARR}.model.path=/models/Qwen2.5-7B", f"critic.model.path={critic}",
                               f"{ARR}.model.lora_adapter_path=/adapters/a")).load()
        keys, notes = model_overrides(real, tmp_path / "small")
        assert f"{ARR}.model.path={tmp_path / 'small'}" in keys
        assert f"critic.model.path={tmp_path / 'small'}" in keys
        assert f"{ARR}.model.lora_adapter_path=null" in keys
        assert any("critic.model.path" in n for n in notes) == (critic == "/models/value-7B")
