"""Progress inside a step: a decoder tells its tokens and rows, the learner
its micro-batches, to whoever listens (the progress bar)."""

from __future__ import annotations

from thinkrl import progress
from thinkrl.api import train


def test_a_run_tells_its_decoding_and_its_micro_batches(asset_cache, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)
    heard: list[str] = []
    with progress.listening(heard.append):
        train("tiny", {"actor_rollout_ref.model.path": str(tiny_model_dir),
                       "trainer.default_local_dir": str(tmp_path / "run"), "data.train_batch_size": 4,
                       "actor_rollout_ref.rollout.n": 2, "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2, "data.max_response_length": 8,
                       "trainer.total_training_steps": 1, "trainer.val_before_train": False,
                       "trainer.test_freq": -1, "trainer.progress_bar": False, "trainer.logger": []},
              doctor=False, log=lambda _: None)
    decoding = [line for line in heard if "tokens/s per row" in line]
    assert decoding and decoding[0].startswith("1/8 tokens, 8/8 rows running")
    assert "mini-batch 1/2, micro-batch 1/2" in heard and "mini-batch 2/2, micro-batch 2/2" in heard
    inner, outer = [], []
    with progress.listening(outer.append), progress.listening(inner.append):  # the bar beside a caller's
        progress.tell(lambda: "both", force=True)
    assert inner == outer == ["both"]


def test_nothing_is_built_when_nobody_listens():
    built = []
    progress.tell(lambda: built.append("text") or "text", force=True)
    assert built == []


def test_the_bar_written_to_a_file_draws_once_a_step(capsys):
    # Not a terminal (CI, `make demo > log`): stages and their progress only change
    # the text the next step's line shows; each redraw would otherwise be a line.
    from types import SimpleNamespace

    from thinkrl.trainer import ProgressBar

    cfg = SimpleNamespace(algorithm=SimpleNamespace(adv_estimator="grpo"),
                          trainer=SimpleNamespace(progress_bar=True))
    bar = ProgressBar(SimpleNamespace(spec=SimpleNamespace(cfg=cfg, total_steps=2),
                                      state=SimpleNamespace(progress=SimpleNamespace(step=0))))
    assert not bar.live
    before = capsys.readouterr().err
    for _ in range(50):
        bar.stage("gen")
        bar.detail("3/8 tokens")
    assert capsys.readouterr().err == ""
    bar.update({"critic/score/mean": 0.5}, {})
    bar.close()
    drawn = capsys.readouterr().err
    assert "1/2" in drawn and "gen" not in drawn and "grpo" in before
