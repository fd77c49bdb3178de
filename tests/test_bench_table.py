"""bench/side_by_side_table.py: the nominal work and the paired ratio, by hand."""

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).parents[1] / "bench" / "side_by_side_table.py"
_spec = importlib.util.spec_from_file_location("side_by_side_table", _PATH)
table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table)


def test_linear_weights_are_the_model_minus_norms_and_biases():
    # small: 1,057,408 parameters (make_inputs.py) = W + 9 RMSNorm weights of 128
    # (2 per layer + final) + q/k/v biases (4 layers x 384).
    assert table.linear_weights("small") == 1_057_408 - 9 * 128 - 4 * 384 == 1_054_720


def test_nominal_work_by_hand():
    # per token 2 W = 2.10944 MFLOP; gen 64 x 16 tokens; ref 64 x (6 + 16); update 3x ref.
    work = table.nominal_gflop("small", 6.0, 16)
    per_token = 2 * 1_054_720 / 1e9
    assert work["gen"] == pytest.approx(per_token * 1024)
    assert work["ref"] == pytest.approx(per_token * 64 * 22)
    assert work["update"] == pytest.approx(3 * work["ref"])


def _trl(rep, seconds):
    return {"bench": "trl_grpo_cpu", "tag": f"trl-small-L16-t1-r{rep}",
            "seconds_per_step_median": seconds, "peak_rss_mb": 600.0,
            "config": {"model_size": "small", "max_completion_length": 16}}


def _tk(rep, seconds):
    return {"bench": "thinkrl_grpo_step", "model_size": "small", "completion_len": 16, "rep": rep,
            "seconds_per_step_median": seconds,
            "stage_median_s": {"gen": 0.1, "ref": 0.05, "update_actor": 0.2},
            "prompt_tokens_per_step": [384.0], "probe_gflops_before": 100.0,
            "probe_gflops_after": 80.0, "info": {"peak_memory_bytes": 500 * 2**20}}


def test_ratio_is_the_median_of_pairs(tmp_path):
    # pairs 0.4/1.0 = 0.4, 0.3/0.5 = 0.6, 0.5/1.0 = 0.5 -> median 0.5; the ratio of
    # medians (0.4 / 1.0) would differ.
    lines = [_trl(1, 1.0), _tk(1, 0.4), _trl(2, 0.5), _tk(2, 0.3), _trl(3, 1.0), _tk(3, 0.5)]
    path = tmp_path / "speed.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    runs = table.load(str(path))
    row = table.row("small", 16, runs[("small", 16)]["trl"], runs[("small", 16)]["thinkrl"])
    assert row["ratio"] == pytest.approx(0.5) and row["pairs"] == 3
    assert row["trl_s"] == 1.0 and row["thinkrl_s"] == 0.4
    assert row["probe_min"] == 80.0 and row["peak_thinkrl_mib"] == 500.0
    assert "**0.50**" in table.markdown([row])
