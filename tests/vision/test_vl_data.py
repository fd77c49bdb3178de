"""Image rows: token expansion, pixels, errors, geo3k prep and its scorer."""

from __future__ import annotations

import importlib.util

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thinkrl.data.dataset import collate, load_prompts
from thinkrl.data.images import ImageEncoder, open_image, row_images, vision_tokens
from thinkrl.data.prep import PrepRequest, prepare
from thinkrl.data.prep.geo3k import INSTRUCTION as GEO3K_INSTRUCTION
from thinkrl.models.loading import load_tokenizer
from thinkrl.rewards.geo3k import compute_score as geo3k_score
from thinkrl.rewards.registry import compute_score

from vl_helpers import png


@pytest.fixture(scope="module")
def encoder(tiny_vl_dir):
    return ImageEncoder.from_model(str(tiny_vl_dir), load_tokenizer(str(tiny_vl_dir)))


def _row(content: str, images: list | None, **extra) -> dict:
    row = {"data_source": "thinkrl/arith", "prompt": [{"role": "user", "content": content}],
           "reward_model": {"style": "rule", "ground_truth": "7"}, **extra}
    if images is not None:
        row["images"] = [{"bytes": b, "path": None} for b in images]
    return row


def _load(tmp_path, rows, encoder, **kwargs):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    settings = dict(key="data.train_files", prompt_key="prompt", reward_fn_key="data_source",
                    max_prompt_length=512, filter_overlong=False, truncation="error",
                    chat_kwargs={}, images=encoder, log=lambda *_: None)
    settings.update(kwargs)
    return load_prompts(str(path), encoder.tokenizer if encoder else None, **settings)


def test_image_mark_becomes_one_pad_token_per_merged_patch(encoder):
    # 112 x 56 pixels -> 8 x 4 patches of 14 -> merged 2 x 2: 4 x 2 = 8 tokens
    tok = encoder.tokenizer
    ids = encoder.prompt_ids("<|im_start|>user\n<image>Hi<|im_end|>\n", [open_image(
        {"bytes": png("1 + 2")}, where="t")])
    pad, start, end = (tok.convert_tokens_to_ids(t) for t in
                       ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>"))
    assert ids.count(pad) == 8
    first = ids.index(pad)
    assert ids[first - 1] == start and ids[first + 8] == end
    assert tok.decode(ids).replace("<|image_pad|>" * 8, "<IMG>") == (
        "<|im_start|>user\n<|vision_start|><IMG><|vision_end|>Hi<|im_end|>\n")


@pytest.mark.parametrize("height,width,expected", [
    (56, 112, 8),     # fits: 2 x 4 units of 28 pixels
    (1000, 2000, 10),  # over max_pixels 12544: scaled by 1/12.63 -> 2 x 5 units
    (20, 20, 4),      # under min_pixels 3136: scaled up to 2 x 2 units
])
def test_token_count_formula_matches_the_processor(encoder, height, width, expected):
    assert vision_tokens(height, width, min_pixels=3136, max_pixels=12544) == expected
    from PIL import Image
    assert encoder.tokens_per_image(Image.new("RGB", (width, height))) == expected


def test_pixels_match_the_grid(encoder):
    values, grid = encoder.pixels([open_image(png("9"), where="t")])
    assert grid.tolist() == [[1, 4, 8]]  # 56 / 14 = 4 rows, 112 / 14 = 8 columns
    assert values.shape == (32, 3 * 2 * 14 * 14)  # t*h*w patches of D = C * T * P * P


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                    reason="the full Qwen2.5-VL processor needs torchvision")
def test_processor_path_gives_the_same_ids(tiny_vl_dir, encoder):
    assert encoder.processor is not None
    fallback = ImageEncoder(encoder.image_processor, encoder.tokenizer)
    text = "<|im_start|>user\n<image>and<image>?<|im_end|>\n<|im_start|>assistant\n"
    images = [open_image(png("1"), where="t"), open_image(png("22", size=(84, 140)), where="t")]
    assert encoder.prompt_ids(text, images) == fallback.prompt_ids(text, images)


def test_rows_load_with_their_images_and_batch_with_pixels(tmp_path, encoder):
    rows = [_row("<image>What is it?", [png("3 + 4")]), _row("Plain", None)]
    prompts = _load(tmp_path, rows, encoder)
    assert len(prompts[0].images) == 1 and prompts[1].images is None
    batch = collate(prompts, pad_token_id=encoder.tokenizer.pad_token_id)
    inputs = batch.model_inputs
    assert [g.tolist() for g in inputs.image_grid_thw] == [[[1, 4, 8]], []]
    assert [v.shape[0] for v in inputs.pixel_values] == [32, 0]
    assert int((batch.input_ids == encoder.image_token_id).sum()) == 8


def test_overlong_image_prompts_are_dropped_or_refused_never_cut(tmp_path, encoder):
    rows = [_row("<image>What is it?", [png("3 + 4")]), _row("Plain", None)]
    with pytest.raises(ValueError, match=r"row 0.*image prompts cannot be truncated"):
        _load(tmp_path, rows, encoder, max_prompt_length=20, truncation="left")
    kept = _load(tmp_path, rows, encoder, max_prompt_length=30, filter_overlong=True)
    assert [p.images for p in kept] == [None]  # the image prompt (8 vision tokens more) went


def test_bad_image_rows_say_which_row_and_what_to_do(tmp_path, encoder):
    with pytest.raises(ValueError, match=r"row 0.*1 <image> mark\(s\) but the row has 2"):
        _load(tmp_path, [_row("<image>?", [png("1"), png("2")])], encoder)
    with pytest.raises(ValueError, match=r"row 0: an image does not open"):
        _load(tmp_path, [_row("<image>?", [b"not a png"])], encoder)
    with pytest.raises(ValueError, match=r"column 'videos' holds videos"):
        row_images({"videos": [b"x"]}, image_key="images", video_key="videos", encoder=encoder,
                   where="f, row 3")
    with pytest.raises(ValueError, match=r"f, row 3, column 'images' holds images, but the "
                                         r"model is text-only"):
        row_images({"images": [b"x"]}, image_key="images", video_key="videos", encoder=None,
                   where="f, row 3")


def _geo3k_folder(tmp_path):
    folder = tmp_path / "geometry3k"
    (folder / "data").mkdir(parents=True)
    rows = [{"images": [{"bytes": png("x"), "path": None}], "problem": "<image>Find x.",
             "answer": "3"},
            {"images": [{"bytes": png("y"), "path": None}], "problem": "Find y.",
             "answer": "2\\sqrt{3}"}]
    for split in ("train", "test", "validation"):
        pq.write_table(pa.Table.from_pylist(rows), folder / "data" / f"{split}-00000-of-00001.parquet")
    return folder


def test_prep_geo3k_writes_verls_rows(tmp_path):
    written = prepare(PrepRequest(source="geo3k", output=tmp_path / "out",
                                  inputs=[str(_geo3k_folder(tmp_path))]))
    assert [w.split for w in written] == ["train", "test"]  # validation is not a split here
    rows = pq.read_table(written[0].path).to_pylist()
    first, second = rows
    assert first["data_source"] == "hiyouga/geometry3k"
    assert first["prompt"] == [{"role": "user", "content": f"<image>Find x. {GEO3K_INSTRUCTION}"}]
    assert second["prompt"][0]["content"].startswith("<image>Find y. You FIRST think")
    assert first["images"][0]["bytes"] == png("x")
    assert first["reward_model"] == {"style": "rule", "ground_truth": "3"}
    assert second["extra_info"]["answer"] == "2\\sqrt{3}" and second["extra_info"]["index"] == 1


def test_geo3k_scorer_weighs_answer_and_format_as_verl():
    right = "<think>The legs are 3 and 3.</think> So x = \\boxed{2\\sqrt 3}."
    assert geo3k_score(right, "2\\sqrt{3}") == {"score": 1.0, "format": 1.0, "accuracy": 1.0}
    wrong = "<think>guess</think> \\boxed{5}"
    assert geo3k_score(wrong, "3")["score"] == pytest.approx(0.1)  # format only
    assert geo3k_score("x = \\boxed{3}", "3")["score"] == pytest.approx(0.9)  # no <think>
    assert geo3k_score("<think>no answer</think>", "3")["score"] == 0.0
    # routed by data_source, as verl's default_compute_score routes geo3k
    assert compute_score("hiyouga/geometry3k", right, "2\\sqrt{3}")["score"] == 1.0


def test_image_prompts_on_the_ray_backend_need_a_frozen_tower(tmp_path, encoder):
    from thinkrl.config import load_config
    from thinkrl.data.images import check_image_backend
    from thinkrl.errors import SetupError

    prompts = _load(tmp_path, [_row("<image>What is it?", [png("3 + 4")]), _row("Plain", None)],
                    encoder)
    ray = load_config(None, ["trainer.n_gpus_per_node=2"])
    with pytest.raises(SetupError, match=r"rows.parquet, row 0 has images.*language model "
                                         r"only; set actor_rollout_ref.model.freeze_vision"):
        check_image_backend(ray, prompts)
    check_image_backend(ray, prompts[1:])  # text prompts on a VL model: any backend
    check_image_backend(load_config(None, []), prompts)  # one device: local
    check_image_backend(load_config(None, ["trainer.n_gpus_per_node=2",
                                           "actor_rollout_ref.model.freeze_vision_tower=True"]),
                        prompts)


def test_pixel_bounds_are_checked_with_the_config():
    from thinkrl.config import load_config
    from thinkrl.config.checks import validate

    base = ["actor_rollout_ref.rollout.n=2"]
    validate(load_config(None, base + ["data.min_pixels=3136", "data.max_pixels=802816"]))
    with pytest.raises(ValueError, match=r"data.min_pixels=5000: must not exceed "
                                         r"data.max_pixels=4000"):
        validate(load_config(None, base + ["data.min_pixels=5000", "data.max_pixels=4000"]))
    with pytest.raises(ValueError, match=r"data.max_pixels=100: an image needs at least 784"):
        validate(load_config(None, base + ["data.max_pixels=100"]))
