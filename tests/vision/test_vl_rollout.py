"""A tiny Qwen2.5-VL through the normal loader, the native engine and the
log-prob pass: text and image prompts, M-RoPE positions, generate-equality."""

from __future__ import annotations

import pytest
import torch

from thinkrl.data.dataset import Prompt, collate
from thinkrl.data.images import ImageEncoder, RowImages
from thinkrl.models.forward import response_logprobs
from thinkrl.models.loading import load_causal_lm, load_tokenizer
from thinkrl.models.vision import prompt_positions, to_model_positions
from thinkrl.records import Sample
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.native import NativeEngine

from vl_helpers import png


@pytest.fixture(scope="module")
def vl(tiny_vl_dir):
    tokenizer = load_tokenizer(str(tiny_vl_dir))
    model = load_causal_lm(str(tiny_vl_dir), dtype=torch.float32, device=torch.device("cpu"))
    encoder = ImageEncoder.from_model(str(tiny_vl_dir), tokenizer)
    return model, tokenizer, encoder


def prompts(tokenizer, encoder, questions: list[tuple[str, list[bytes]]]) -> list[Prompt]:
    out = []
    for i, (question, images) in enumerate(questions):
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                             tokenize=False, add_generation_prompt=True)
        row = RowImages(tuple(images), encoder, f"row {i}") if images else None
        ids = (encoder.prompt_ids(text, row.open()) if row
               else tokenizer(text, add_special_tokens=False)["input_ids"])
        out.append(Prompt(ids, Sample("test", "0", text, index=i), row))
    return out


def test_loads_the_image_text_to_text_class(vl):
    model, _, _ = vl
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert model.config.text_config.rope_parameters["mrope_section"] == [2, 3, 3]


def rollout_and_training_logprobs(model, tokenizer, batch, *, n: int, max_tokens: int):
    engine = NativeEngine(model, eos_token_ids=[tokenizer.eos_token_id],
                          pad_token_id=tokenizer.pad_token_id, seed=3)
    rollouts = engine.generate(batch, SamplingParams(n=n, max_tokens=max_tokens, temperature=1.0))
    input_ids, mask, positions = rollouts.sequences()
    with torch.no_grad():
        train, _ = response_logprobs(model, input_ids, mask, positions,
                                     response_length=rollouts.response_ids.shape[1],
                                     temperature=1.0, model_inputs=rollouts.model_inputs)
    return rollouts, train


def test_text_prompts_sample_with_the_training_logprobs(vl):
    model, tokenizer, encoder = vl
    batch = collate(prompts(tokenizer, encoder, [("What is 2 + 3?", []), ("Hi", [])]),
                    pad_token_id=tokenizer.pad_token_id)
    assert batch.model_inputs is None  # text prompts take the causal-LM path
    rollouts, train = rollout_and_training_logprobs(model, tokenizer, batch, n=2, max_tokens=6)
    mask = rollouts.response_mask.bool()
    # float32 on the CPU: a KV-cached decode and a full forward agree to ~3e-6 (measured)
    assert torch.allclose(rollouts.rollout_logprobs[mask], train[mask], atol=2e-5)


def test_image_prompts_sample_with_the_training_logprobs(vl):
    model, tokenizer, encoder = vl
    rows = [("<image>What is written?", [png("3 + 4")]),
            ("Plain text row", []),
            ("<image> and <image>: which is larger?", [png("12", size=(56, 140)), png("7")])]
    batch = collate(prompts(tokenizer, encoder, rows), pad_token_id=tokenizer.pad_token_id)
    grids = batch.model_inputs.image_grid_thw
    assert [g.shape[0] for g in grids] == [1, 0, 2]
    rollouts, train = rollout_and_training_logprobs(model, tokenizer, batch, n=2, max_tokens=6)
    mask = rollouts.response_mask.bool()
    assert torch.allclose(rollouts.rollout_logprobs[mask], train[mask], atol=2e-5)
    # The positions every pass used are the model's own get_rope_index over
    # the whole sequence (prompt + response) wherever the mask is 1.
    input_ids, attention_mask, positions = rollouts.sequences()  # [N, 3, S]
    grid = torch.cat([g for g in rollouts.model_inputs.image_grid_thw if g.numel()])
    full = prompt_positions(model, input_ids, attention_mask, grid)
    keep = attention_mask.bool()[:, None, :].expand_as(full)
    assert torch.equal(positions[keep], full[keep])
    # Row 0's image has a 2 x 4 merged grid after the 112 x 56 image becomes
    # 4 x 8 patches: its tokens sit at rows start+0..1, columns start+0..3, and
    # the text after it resumes at start + max(2, 4) = start + 4.
    assert grids[0].tolist() == [[1, 4, 8]]
    row = 0  # response 0 of prompt 0
    is_image = input_ids[row] == model.config.image_token_id
    first = int(is_image.nonzero()[0])
    start = int(positions[row, 0, first - 1]) + 1  # the text before it ends at start - 1
    image_positions = positions[row][:, is_image]  # [3, 8]
    assert image_positions[0].tolist() == [start] * 8  # t
    assert image_positions[1].tolist() == [start + r for r in (0, 0, 0, 0, 1, 1, 1, 1)]  # h
    assert image_positions[2].tolist() == [start + c for c in (0, 1, 2, 3, 0, 1, 2, 3)]  # w
    after = first + 8
    assert positions[row, :, after].tolist() == [start + 4] * 3


def test_image_rows_change_what_the_model_computes(vl):
    # Pixels reach the model: the same ids with other pixels give other log-probs.
    model, tokenizer, encoder = vl
    a = collate(prompts(tokenizer, encoder, [("<image>Read it", [png("1")])]),
                pad_token_id=tokenizer.pad_token_id)
    b = collate(prompts(tokenizer, encoder, [("<image>Read it", [png("999999")])]),
                pad_token_id=tokenizer.pad_token_id)
    assert torch.equal(a.input_ids, b.input_ids)
    la, _ = rollout_and_training_logprobs(model, tokenizer, a, n=1, max_tokens=3)
    engine_b = NativeEngine(model, eos_token_ids=[tokenizer.eos_token_id],
                            pad_token_id=tokenizer.pad_token_id, seed=3)
    lb = engine_b.generate(b, SamplingParams(n=1, max_tokens=3, do_sample=False))
    ga = NativeEngine(model, eos_token_ids=[tokenizer.eos_token_id],
                      pad_token_id=tokenizer.pad_token_id, seed=3).generate(
        a, SamplingParams(n=1, max_tokens=3, do_sample=False))
    assert not torch.allclose(ga.rollout_logprobs, lb.rollout_logprobs)


def test_greedy_decoding_equals_transformers_generate_with_images(vl):
    model, tokenizer, encoder = vl
    rows = [("<image>What is written?", [png("3 + 4")]),
            ("<image>Name the number", [png("42", size=(84, 84))])]
    batch = collate(prompts(tokenizer, encoder, rows), pad_token_id=tokenizer.pad_token_id)
    engine = NativeEngine(model, eos_token_ids=[tokenizer.eos_token_id],
                          pad_token_id=tokenizer.pad_token_id, seed=0)
    ours = engine.generate(batch, SamplingParams(n=1, max_tokens=8, do_sample=False))
    image_tokens = (batch.input_ids == model.config.image_token_id).int()
    with torch.no_grad():
        theirs = model.generate(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask,
            pixel_values=torch.cat(batch.model_inputs.pixel_values),
            image_grid_thw=torch.cat(batch.model_inputs.image_grid_thw),
            mm_token_type_ids=image_tokens, max_new_tokens=8, do_sample=False,
            eos_token_id=-1, pad_token_id=tokenizer.pad_token_id)
    # eos_token_id=-1: transformers never stops early, so compare up to our stop.
    generated = theirs[:, batch.input_ids.shape[1]:]
    width = ours.response_ids.shape[1]
    mask = ours.response_mask.bool()
    assert torch.equal(ours.response_ids[mask], generated[:, :width][mask])


def test_model_layout_of_positions():
    rows_first = torch.arange(2 * 3 * 4).view(2, 3, 4)  # [N, 3, S]
    assert to_model_positions(rows_first).shape == (3, 2, 4)
    assert torch.equal(to_model_positions(rows_first)[1, 0], rows_first[0, 1])
    flat = torch.arange(8).view(2, 4)
    assert to_model_positions(flat) is flat


def test_other_vision_language_models_are_refused(tmp_path):
    import json

    from thinkrl.errors import SetupError
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava",
                                                      "vision_config": {}}))
    with pytest.raises(SetupError, match=r"of type 'llava'.*use one of Qwen2.5-VL, Qwen2-VL"):
        load_causal_lm(str(tmp_path), dtype=torch.float32, device=torch.device("cpu"))


def test_qwen2_vl_takes_the_same_path(tmp_path):
    from conftest import QWEN_TOKENIZER
    from thinkrl.models.tiny_vl import TinyVLSpec, build_tiny_vl

    if not (QWEN_TOKENIZER / "vocab.json").is_file():
        pytest.skip("../shared/data is absent")
    folder = build_tiny_vl(tmp_path / "qwen2-vl", tokenizer_dir=QWEN_TOKENIZER,
                           spec=TinyVLSpec(model_type="qwen2_vl"))
    model = load_causal_lm(str(folder), dtype=torch.float32, device=torch.device("cpu"))
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    tokenizer = load_tokenizer(str(folder))
    encoder = ImageEncoder.from_model(str(folder), tokenizer)
    batch = collate(prompts(tokenizer, encoder, [("<image>What is written?", [png("5 - 2")]),
                                                 ("No image", [])]),
                    pad_token_id=tokenizer.pad_token_id)
    rollouts, train = rollout_and_training_logprobs(model, tokenizer, batch, n=2, max_tokens=5)
    mask = rollouts.response_mask.bool()
    assert torch.allclose(rollouts.rollout_logprobs[mask], train[mask], atol=2e-5)


def test_dapo_batches_concatenate_with_their_images_and_positions(vl):
    # DAPO's dynamic sampling joins generation batches of different prompt
    # widths (and a batch may hold no image at all): the joined record must
    # still give each row the positions get_rope_index gives its sequence.
    from thinkrl.stages.sampling import ScoredRollouts, _concat
    from thinkrl.rewards.scorer import ScoreResult

    model, tokenizer, encoder = vl
    engine = NativeEngine(model, eos_token_ids=[tokenizer.eos_token_id],
                          pad_token_id=tokenizer.pad_token_id, seed=1)
    params = SamplingParams(n=2, max_tokens=4)
    wide = collate(prompts(tokenizer, encoder, [("<image> and <image>: a long question here?",
                                                 [png("1"), png("22", size=(84, 140))])]),
                   pad_token_id=tokenizer.pad_token_id)
    text = collate(prompts(tokenizer, encoder, [("Hi", [])]), pad_token_id=tokenizer.pad_token_id)
    parts = []
    for batch in (wide, text):
        r = engine.generate(batch, params)
        scored = ScoreResult(torch.zeros(len(r)), 0, 0)
        parts.append(ScoredRollouts(r, [""] * len(r), scored, torch.zeros(len(r)), {}))
    joined = _concat(parts, pad_token_id=tokenizer.pad_token_id).rollouts
    assert [g.shape[0] for g in joined.model_inputs.image_grid_thw] == [2, 2, 0, 0]
    input_ids, mask, positions = joined.sequences()
    grid = torch.cat([g for g in joined.model_inputs.image_grid_thw if g.numel()])
    expected = prompt_positions(model, input_ids, mask, grid)
    keep = mask.bool()[:, None, :].expand_as(expected)
    assert torch.equal(positions[keep], expected[keep])
    with torch.no_grad():
        train, _ = response_logprobs(model, input_ids, mask, positions,
                                     response_length=joined.response_ids.shape[1],
                                     temperature=1.0, model_inputs=joined.model_inputs)
    rmask = joined.response_mask.bool()
    assert torch.allclose(joined.rollout_logprobs[rmask], train[rmask], atol=2e-5)
