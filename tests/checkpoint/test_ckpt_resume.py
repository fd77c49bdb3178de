"""Checkpoints on real tiny runs: a stopped and resumed run equals a straight one,
a save that dies leaves the previous checkpoint as latest, export round-trips.

One straight 4-step run (checkpoint every step, validation every 2 steps) on
8 training prompts in batches of 4: two steps per epoch, so step 2 ends epoch 0
and step 3 is the middle of epoch 1. Two shuffled mini-batches per step, so
the actor's shuffle generator and the AdamW state both shape the next steps
(each state left out of the restore was seen to change the metrics). The other runs resume from its
checkpoints, copied into a new folder together with its full metrics.jsonl
(the resumed run must drop the records after its checkpoint's step).
"""

from __future__ import annotations

import errno
import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from thinkrl.checkpoint.sharded import OPTIMIZER_FILE
from thinkrl.checkpoint.state import TRAINER_STATE_FILE, load_checkpoint
from thinkrl.checkpoint.store import TRACKER, latest_checkpoint
from thinkrl.checkpoint.verify import sha256_file
from thinkrl.cli import main, recipe_path
from thinkrl.errors import DiskFull
from thinkrl.config import load_config
from thinkrl.trainer import train

pytestmark = pytest.mark.slow
STEPS = 4


@pytest.fixture(scope="module")
def data_files(tmp_path_factory) -> tuple[Path, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from thinkrl.data import synthetic
    from thinkrl.data.prep.builtin_arith import to_example
    from thinkrl.data.prep.examples import to_verl_rows

    folder = tmp_path_factory.mktemp("ckpt-data")
    problems = synthetic.generate_problems(10, seed=7)
    for name, rows in (("train", problems[:8]), ("val", problems[8:])):
        table = to_verl_rows([to_example(p) for p in rows], split=name,
                             instruction=synthetic.INSTRUCTION)
        pq.write_table(pa.Table.from_pylist(table), folder / f"{name}.parquet")
    return folder / "train.parquet", folder / "val.parquet"


def _config(model_dir: Path, data: tuple[Path, Path], run_dir: Path, *extra: str):
    return load_config(recipe_path("tiny"), [
        f"actor_rollout_ref.model.path={model_dir}", f"trainer.default_local_dir={run_dir}",
        f"data.train_files={data[0]}", f"data.val_files={data[1]}",
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.shuffle=True",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "data.max_response_length=16", "data.val_batch_size=100",
        # The entropy bonus moves the weights even when every group scores the
        # same, so a state restored wrongly shows up in the next steps' metrics.
        "actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.optim.lr=1e-3",
        # ...and drives the tiny model to 99 % of the uniform entropy by step 3,
        # which the divergence guard rightly calls destroyed: off for this test.
        "trainer.divergence_guard=False",
        "actor_rollout_ref.actor.optim.warmup_style=constant",
        f"trainer.total_training_steps={STEPS}", "trainer.test_freq=2", "trainer.save_freq=1",
        "trainer.progress_bar=False", "trainer.logger=[]", *extra])


def _train(cfg) -> tuple[object, list[dict], list[str]]:
    messages: list[str] = []
    result = train(cfg, log=messages.append)
    lines = (Path(result.run_dir) / "metrics.jsonl").read_text().splitlines()
    return result, [json.loads(line) for line in lines], messages


def _without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/"))}
            for r in records]


@pytest.fixture(scope="module")
def straight(asset_cache, tiny_model_dir, data_files, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    _, records, _ = _train(_config(tiny_model_dir, data_files, run_dir))
    return run_dir, records


def _copy_checkpoint(straight_dir: Path, step: int, dest: Path) -> Path:
    dest.mkdir(parents=True)
    shutil.copytree(straight_dir / f"global_step_{step}", dest / f"global_step_{step}")
    shutil.copy(straight_dir / "metrics.jsonl", dest / "metrics.jsonl")  # all steps
    return dest


def test_checkpoint_layout(straight):
    run_dir, records = straight
    assert [r["step"] for r in records] == list(range(STEPS + 1))
    assert (run_dir / TRACKER).read_text().strip() == str(STEPS)
    assert sorted(p.name for p in run_dir.glob("global_step_*")) == [
        f"global_step_{i}" for i in range(1, STEPS + 1)]
    last = run_dir / f"global_step_{STEPS}"
    assert json.loads((last / "meta.json").read_text())["step"] == STEPS
    for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
        assert (last / "actor" / name).is_file(), name
    # Only tensors and plain values: loadable without unpickling any object.
    optimizer = torch.load(last / OPTIMIZER_FILE, weights_only=True)
    assert optimizer["state"][0]["step"].item() == 2 * STEPS  # two mini-batches a step
    state = torch.load(last / TRAINER_STATE_FILE, weights_only=True)
    assert state["loader"] == {"epoch": 1, "position": 2}


@pytest.mark.parametrize("step, epoch_position", [(2, (0, 2)), (3, (1, 1))],
                         ids=["epoch-boundary", "mid-epoch"])
def test_resumed_run_equals_straight_run(straight, tiny_model_dir, data_files, tmp_path,
                                         step, epoch_position):
    straight_dir, straight_records = straight
    state = torch.load(straight_dir / f"global_step_{step}" / TRAINER_STATE_FILE, weights_only=True)
    assert (state["loader"]["epoch"], state["loader"]["position"]) == epoch_position
    run_dir = _copy_checkpoint(straight_dir, step, tmp_path / "run")
    result, records, messages = _train(_config(tiny_model_dir, data_files, run_dir))
    assert any(f"resuming from {run_dir / f'global_step_{step}'}" in m for m in messages)
    assert not any("config differs" in m for m in messages)
    assert [r["step"] for r in records] == list(range(STEPS + 1))
    assert _without_timing(records) == _without_timing(straight_records)
    assert result.first_val == {k: v for k, v in straight_records[0].items() if k.startswith("val-")}
    assert (run_dir / TRACKER).read_text().strip() == str(STEPS)


def test_resume_at_the_last_step_has_nothing_to_do(straight, tiny_model_dir, data_files,
                                                   tmp_path):
    straight_dir, straight_records = straight
    run_dir = _copy_checkpoint(straight_dir, STEPS, tmp_path / "run")
    result, records, messages = _train(_config(tiny_model_dir, data_files, run_dir))
    assert any("nothing left to train" in m for m in messages)
    assert result.steps == STEPS and records == straight_records
    assert result.last_val and result.last_val.items() <= straight_records[-1].items()


def test_save_that_fails_midway_leaves_the_previous_checkpoint(
        straight, tiny_model_dir, data_files, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    # A 2-step run (constant LR, so its steps equal the straight run's), keeping 1 checkpoint.
    cfg = lambda: _config(tiny_model_dir, data_files, run_dir, "trainer.total_training_steps=2",
                          "trainer.max_actor_ckpt_to_keep=1", "trainer.val_before_train=False")
    real_save = torch.save

    def disk_full_at_step_2(obj, f, *args, **kwargs):
        if Path(f).name == OPTIMIZER_FILE and "global_step_2" in str(f):
            raise OSError(errno.ENOSPC, "No space left on device", str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_at_step_2)
    with pytest.raises(DiskFull, match="No space left"):
        train(cfg(), log=lambda *_: None)
    monkeypatch.undo()
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith("global_step")) == [
        "global_step_1"]  # the failed save cleaned up after itself
    assert (run_dir / TRACKER).read_text().strip() == "1"
    # A save killed outright leaves its temporary folder behind; a stray
    # folder without the completion marker is never taken for a checkpoint.
    (run_dir / "global_step_2.tmp-99999999").mkdir()
    (run_dir / "global_step_2.tmp-99999999" / OPTIMIZER_FILE).write_bytes(b"half")
    (run_dir / "global_step_7").mkdir()
    assert latest_checkpoint(run_dir) == run_dir / "global_step_1"

    _, records, messages = _train(cfg())
    assert any(f"resuming from {run_dir / 'global_step_1'}," in m for m in messages)
    assert not (run_dir / "global_step_2.tmp-99999999").exists()
    assert [r["step"] for r in records] == [1, 2]  # the dead run's step 2 was redone once
    assert _without_timing(records) == _without_timing(straight[1][1:3])
    assert (run_dir / TRACKER).read_text().strip() == "2"
    assert not (run_dir / "global_step_1").exists()  # rotated: max_actor_ckpt_to_keep=1
    assert (run_dir / "global_step_2" / "meta.json").is_file()


def test_resume_path_that_is_missing_lists_the_checkpoints(straight, tiny_model_dir,
                                                           data_files, tmp_path):
    straight_dir, _ = straight
    cfg = _config(tiny_model_dir, data_files, tmp_path / "run", "trainer.resume_mode=resume_path",
                  f"trainer.resume_from_path={straight_dir / 'global_step_9'}")
    with pytest.raises(ValueError, match="global_step_9.*global_step_1, global_step_2"):
        train(cfg, log=lambda *_: None)


class _Payload:
    """Any class: unpickling it would run code of the file's choosing."""


@pytest.fixture(scope="module")
def resumed_run(straight, tiny_model_dir, data_files, tmp_path_factory):
    """The straight run's actor at its last step, rebuilt from the checkpoint."""
    from thinkrl.build import build_run

    straight_dir, _ = straight
    cfg = _config(tiny_model_dir, data_files, tmp_path_factory.mktemp("resumed") / "run",
                  "trainer.resume_mode=resume_path",
                  f"trainer.resume_from_path={straight_dir}")
    run = build_run(cfg, log=lambda *_: None)
    assert run.state.progress.step == STEPS
    yield run
    run.close()


def test_pickled_objects_are_refused(straight, resumed_run, tmp_path):
    straight_dir, _ = straight
    bad = shutil.copytree(straight_dir / "global_step_1", tmp_path / "global_step_1")
    torch.save({"step": 1, "payload": _Payload()}, bad / TRAINER_STATE_FILE)
    before = [p.detach().clone() for p in resumed_run.roles.actor.group.rank.actor.model.parameters()]
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(resumed_run, bad, log=lambda *_: None)
    after = resumed_run.roles.actor.group.rank.actor.model.parameters()
    assert all(torch.equal(b, p) for b, p in zip(before, after))


def test_export_gives_the_actors_log_probs(straight, resumed_run, tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from thinkrl.data.dataset import collate
    from thinkrl.models.forward import batched_response_logprobs

    straight_dir, _ = straight
    out = tmp_path / "hf"
    assert main(["export", str(straight_dir), "--out", str(out)]) == 0
    assert main(["export", str(straight_dir), "--out", str(out)]) == 2  # never overwrites
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()
    actor = resumed_run.roles.actor.group.rank.actor
    exported = model.state_dict()
    for name, tensor in actor.model.state_dict().items():
        assert torch.equal(exported[name], tensor), name
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert not torch.equal(initial.lm_head.weight, model.lm_head.weight)  # trained weights

    run = resumed_run
    prompts = collate(run.spec.val_prompts, pad_token_id=run.spec.tokenizer.pad_token_id)
    rollouts = run.roles.engine.generate(prompts, run.spec.sampling)
    sequences = rollouts.sequences()
    length = rollouts.response_ids.shape[1]
    expected = actor.compute_log_prob(*sequences, response_length=length)
    got = batched_response_logprobs(model, *sequences, response_length=length,
                                    temperature=actor.temperature, micro_batch_size=64)
    mask = rollouts.response_mask.bool()
    assert torch.allclose(got[mask], expected[mask], atol=1e-5)


def test_a_failed_resume_keeps_the_metrics(straight, tiny_model_dir, data_files, tmp_path):
    """metrics.jsonl changes only once the checkpoint has loaded."""
    straight_dir, _ = straight
    run_dir = tmp_path / "run"
    shutil.copytree(straight_dir, run_dir)
    for step in range(3, STEPS + 1):  # step 2 is the latest; metrics go on to step 4
        shutil.rmtree(run_dir / f"global_step_{step}")
    (run_dir / TRACKER).write_text("2")
    torch.save({"step": 2, "payload": _Payload()}, run_dir / "global_step_2" / TRAINER_STATE_FILE)
    # Its checksum updated too, so verification passes and the load itself fails
    # (a changed file with its old checksum is skipped: tests/faults).
    meta_path = run_dir / "global_step_2" / "meta.json"
    meta = json.loads(meta_path.read_text())
    state_file = run_dir / "global_step_2" / TRAINER_STATE_FILE
    meta["files"][TRAINER_STATE_FILE] = {"bytes": state_file.stat().st_size,
                                         "sha256": sha256_file(state_file)}
    meta_path.write_text(json.dumps(meta))
    before = (run_dir / "metrics.jsonl").read_text()
    assert '"step": 4' in before
    with pytest.raises(pickle.UnpicklingError):
        train(_config(tiny_model_dir, data_files, run_dir), log=lambda *_: None)
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_a_resume_with_a_new_lr_trains_at_the_new_lr(straight, tiny_model_dir, data_files,
                                                     tmp_path):
    # The config-differs note says the run continues with the new values: the
    # learning rate too, not the one saved in the optimizer state.
    straight_dir, _ = straight
    run_dir = _copy_checkpoint(straight_dir, 1, tmp_path / "run")
    _, records, messages = _train(_config(tiny_model_dir, data_files, run_dir,
                                          "actor_rollout_ref.actor.optim.lr=5e-4"))
    assert any("config differs" in m and "optim.lr: 0.001 -> 0.0005" in m for m in messages)
    assert [r["actor/lr"] for r in records if r["step"] > 1] == [5e-4] * (STEPS - 1)


def test_a_weights_only_save_exports_and_refuses_to_resume(straight, tiny_model_dir, data_files,
                                                           tmp_path):
    # save_contents=[model]: the actor folder alone, the same weights as the full save's.
    run_dir = tmp_path / "weights"
    cfg = _config(tiny_model_dir, data_files, run_dir, "trainer.total_training_steps=2",
                  "actor_rollout_ref.actor.checkpoint.save_contents=[model]")
    _, _, messages = _train(cfg)
    assert any("model: not resumable" in m for m in messages)
    folder, full = run_dir / "global_step_2", straight[0] / "global_step_2"
    assert json.loads((folder / "meta.json").read_text())["contents"] == ["model"]
    assert json.loads((full / "meta.json").read_text())["contents"] == ["model", "optimizer", "extra"]
    assert not (folder / OPTIMIZER_FILE).exists() and not (folder / TRAINER_STATE_FILE).exists()
    assert sha256_file(folder / "actor" / "model.safetensors") == sha256_file(
        full / "actor" / "model.safetensors")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert size < 0.5 * sum(p.stat().st_size for p in full.rglob("*") if p.is_file())
    assert main(["export", str(run_dir), "--out", str(tmp_path / "hf")]) == 0
    with pytest.raises(ValueError, match=r"holds no optimizer and no extra state.*save_contents"
                                         r".*thinkrl export"):
        _train(_config(tiny_model_dir, data_files, run_dir, "trainer.total_training_steps=3"))
    from thinkrl.exits import resume_line

    assert "cannot be resumed from; export it" in resume_line(["train", "--config", "tiny"], run_dir)


def test_save_contents_must_name_known_parts_and_the_weights(tiny_model_dir, data_files, tmp_path):
    for bad in ("[optimizer,extra]", "[model,adam]"):
        with pytest.raises(ValueError, match=r"checkpoint.save_contents=.*weights only, for export"):
            from thinkrl.config.checks import validate
            validate(_config(tiny_model_dir, data_files, tmp_path,
                             f"actor_rollout_ref.actor.checkpoint.save_contents={bad}"))


def test_a_key_added_since_the_save_at_its_default_is_no_config_change(straight, tmp_path):
    import yaml

    from thinkrl.checkpoint.state import CONFIG_FILE, _note_config_changes

    saved = yaml.safe_load((straight[0] / "global_step_1" / CONFIG_FILE).read_text())
    cfg = load_config(saved)  # the run's own config, as resumed with this thinkrl
    del saved["actor_rollout_ref"]["actor"]["checkpoint"]  # as a checkpoint from before the key
    (tmp_path / CONFIG_FILE).write_text(yaml.safe_dump(saved))
    notes: list[str] = []
    _note_config_changes(cfg, tmp_path, {"config_sha256": "older"}, log=notes.append)
    assert notes == []
    cfg.actor_rollout_ref.actor.checkpoint.save_contents = ["model"]
    _note_config_changes(cfg, tmp_path, {"config_sha256": "older"}, log=notes.append)
    assert len(notes) == 1 and "save_contents: None -> ['model']" in notes[0]
