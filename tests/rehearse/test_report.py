"""The rehearsal's checks and numbers that need no run: image paths over
every row, the reward failures of training said in the real file's rows,
the time split and the projection's arithmetic."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from thinkrl.rehearse.checks import check_image_paths, response_reward_failure
from thinkrl.rehearse.plan import sample_rows
from thinkrl.rehearse.report import Projection, time_split


def test_every_row_s_image_paths_are_checked(tmp_path):
    (tmp_path / "a.png").write_bytes(b"png")
    cell = {"bytes": None, "path": None, "image": None}
    rows = [[{**cell, "path": str(tmp_path / "a.png")}], [], [{**cell, "bytes": b"\x89PNG"}],
            [{**cell, "image": str(tmp_path / "gone.png")}], [{**cell, "path": str(tmp_path / "x.png")}]]
    pq.write_table(pa.table({"images": rows}), tmp_path / "train.parquet")
    found = check_image_paths([tmp_path / "train.parquet"] * 2, image_key="images")
    assert found == (f"{tmp_path / 'train.parquet'}, row 3: the image {tmp_path / 'gone.png'} does not "
                     "exist (2 image path(s) missing in all)")  # the repeated file counted once
    pq.write_table(pa.table({"images": [str(tmp_path / "a.png"), str(tmp_path / "b.png")]}),
                   tmp_path / "plain.parquet")  # plain path cells
    assert "row 1: the image" in check_image_paths([tmp_path / "plain.parquet"], image_key="images")
    assert check_image_paths([tmp_path / "train.parquet"], image_key="pictures") is None


def test_reward_failures_in_training_name_the_real_file_s_row(tmp_path):
    source = tmp_path / "train.parquet"
    pq.write_table(pa.table({"q": list(range(40))}), source)
    sample = sample_rows([source], tmp_path / "sample", rows=5, seed=0)
    [written] = sample.files
    real = pq.read_table(written).column("q").to_pylist()
    metrics = [{"reward/errors": 2.0, "reward/timeouts": 0.0}, {"reward/errors": 1.0}]
    reason = "reward for data_source me/task, row 3 failed (KeyError: 'row 1'); counted"
    found, fix = response_reward_failure(metrics, [reason], sample, [written])
    assert found.startswith("the reward failed on 3 and timed out on 0 of the shrunken model's")
    assert f"data_source me/task, {source}, row {real[3]} failed (KeyError: 'row 1')" in found
    assert "must not raise" in fix
    assert response_reward_failure([{"reward/errors": 0.0}], [], sample, [written]) is None


def test_time_split_and_projection_arithmetic():
    step = {"timing_s/step": 10.0, "timing_s/gen": 4.0, "timing_s/update_actor": 5.0,
            "timing_s/testing": 3.0, "actor/pg_loss": 0.1}
    assert time_split(step) == {"gen": 0.4, "update_actor": 0.5}
    gib = 2**30
    projection = Projection(prompts=4, responses=8, prompt_tokens=100.0, response_tokens=156,
                            time_split={}, micro_batches=[(1, 40 * gib), (2, 60 * gib), (4, 70 * gib)],
                            asked=2, dynamic=False, capacity=64 * gib, device="npu", assumed="test")
    assert projection.tokens_per_step == 8 * (100 + 156)
    assert projection.largest_fitting == 2
    assert "largest micro-batch per device that fits: 2 (the run asks 2)" in projection.lines()[2]
