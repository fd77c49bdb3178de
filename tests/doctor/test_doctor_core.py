"""The runner, the table, the CLI and a good configuration end to end."""

from __future__ import annotations

import json
import shutil
from collections import namedtuple

from doctor_helpers import context

from thinkrl.cli import main
from thinkrl.doctor import CheckResult, NotChecked, memory, run_check, run_checks
from thinkrl.doctor.report import WIDTHS, listing, table

Usage = namedtuple("Usage", "total used free")
GiB = 2**30


def check_explodes(ctx):
    raise KeyError("boom")


def check_needs_sizes(ctx):
    return CheckResult("core/needs-sizes", "ok", f"{ctx.sizes.world_size} device(s)")


def test_a_check_that_raises_becomes_a_fail_row():
    [row] = run_check(check_explodes, context())
    assert row.status == "fail"
    assert row.check == "test_doctor_core/explodes"  # module and function name
    assert "KeyError" in row.found and "boom" in row.found


def test_a_check_whose_input_is_broken_is_skipped_with_the_reason():
    ctx = context("data.train_batch_size=30")  # 30 is not a multiple of ppo_mini_batch_size 32
    [row] = run_checks(ctx, [check_needs_sizes])
    assert row.status == "skip" and "config/validate" in row.found


def test_not_checked_is_remembered_for_every_caller():
    ctx, calls = context(), []

    def broken():
        calls.append(1)
        raise NotChecked("no model")
    for _ in range(2):
        try:
            ctx.remember("x", broken)
        except NotChecked as why:
            assert str(why) == "no model"
    assert calls == [1]


def test_table_fits_120_columns_and_listing_keeps_paths_whole():
    long_path = "/very/long/path/" + "x" * 200 + "/train.parquet"
    rows = [CheckResult("data/files", "fail", f"no such file {long_path}", "point data.train_files at it"),
            CheckResult("environment/vllm-ascend-nz", "ok", "fine")]
    text = table(rows)
    assert sum(WIDTHS) + 2 * (len(WIDTHS) - 1) <= 120
    assert max(len(line) for line in text.splitlines()) <= 120
    assert long_path in listing(rows)


def test_good_tiny_configuration_has_no_fail_and_json_parses(tiny_run, capsys, monkeypatch):
    # Comfortable disk and RAM, whatever the machine running the tests has:
    # a CI runner with a small disk must not fail this test.
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(500 * GiB, 100 * GiB, 400 * GiB))
    monkeypatch.setattr(memory, "host_available", lambda: 64 * GiB)
    code = main(["doctor", "--config", "tiny", "--json", *tiny_run])
    out = capsys.readouterr().out
    rows = json.loads(out)
    assert code == 0, [r for r in rows if r["status"] != "ok"]
    # The real disk and memory checks ran, on the stubbed readings.
    disk_rows = [r for r in rows if r["check"].startswith("disk/")]
    assert disk_rows and all("400.0 GiB free of 500.0 GiB" in r["found"] for r in disk_rows)
    assert any("64.0 GiB" in r["found"] for r in rows if r["check"].startswith("memory/"))
    assert {r["status"] for r in rows} <= {"ok", "warn"}
    families = {r["check"].split("/")[0] for r in rows}
    assert families == {"config", "data", "model", "vision", "versions", "environment", "disk", "memory"}
    assert set(rows[0]) == {"check", "status", "found", "fix"}


def test_doctor_exits_1_on_a_failure(tiny_run, capsys):
    code = main(["doctor", "--config", "tiny", *tiny_run, "actor_rollout_ref.rollout.name=sglang"])
    out = capsys.readouterr().out
    assert code == 1 and "config/backend" in out and "fail" in out


def test_train_refuses_to_start_on_a_failure_and_names_it(tiny_run, capsys):
    code = main(["train", "--config", "tiny", *tiny_run, "data.max_prompt_length=8"])
    err = capsys.readouterr().err
    assert code == 2
    assert "data/prompt-length" in err and "--skip-doctor" in err
