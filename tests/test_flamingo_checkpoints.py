"""OpenFlamingo and Otter checkpoints written as the originals write them load into the same model.

The tiny checkpoints come from :mod:`mmcomp_eval.testing.flamingo_formats`
(the originals' names: Otter's flat perceiver layers and ``feed_forward``,
its MPT without ``lm_head`` and with more embedding rows than tokens, the
buffers transformers 4 saved; OpenFlamingo's filtered ``checkpoint.pt`` with
GPT-NeoX's ``embed_out``). Each test loads through the adapters and checks
the logits are the written model's, so a name mapped to the wrong weight
fails here. ``bench/bench_flamingo_parity.py`` checks the same against the
originals' own code.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from mmcomp_eval.errors import UserError
from mmcomp_eval.media import synthetic as S
from mmcomp_eval.models import create_model
from mmcomp_eval.models.flamingo.images import ImageTransform
from mmcomp_eval.testing.tiny_models import write_random_flamingo

PROMPT = "take knife <image> . wash plate <image> => cut onion<|endofchunk|>open tap <image> =>"


@pytest.fixture(scope="module")
def corpus():
    return S.corpus()


def same_logits(adapter, written, columns: slice = slice(None)) -> float:
    """Max |logit difference| between the loaded adapter's model and the model that was written, on PROMPT."""
    images = [S.frame_image(1, 40 * c + 3) for c in range(3)]
    batch = adapter.encode([PROMPT], [images])
    written.model.eval()
    with torch.no_grad():
        ours = adapter.model(batch["pixel_values"], batch["counts"], batch["input_ids"], batch["attention_mask"])
        theirs = written.model(batch["pixel_values"], batch["counts"], batch["input_ids"], batch["attention_mask"])
        no_images = adapter.model(torch.zeros_like(batch["pixel_values"]), batch["counts"], batch["input_ids"],
                                  batch["attention_mask"])
    assert (ours.logits - no_images.logits).abs().max() > 0.1  # the images matter, so the check sees them
    return float((ours.logits - theirs.logits)[..., columns].abs().max())


def test_otter_mpt_without_lm_head_keeps_its_larger_vocabulary(corpus, tmp_path):
    written = write_random_flamingo(tmp_path / "otter", corpus, "otter", "mpt", extra_vocab=7)
    state = load_file(tmp_path / "otter" / "model.safetensors")
    # Otter's names: flat perceiver layers, feed_forward, wrapped decoder layers, no output layer (tied to wte)
    assert {"perceiver.layers.0.to_q.weight", "perceiver.layers.0.feed_forward.1.weight",
            "lang_encoder.transformer.blocks.0.gated_cross_attn_layer.feed_forward.1.weight",
            "lang_encoder.transformer.blocks.0.decoder_layer.attn.Wqkv.weight",
            "lang_encoder.transformer.wte.weight"} <= state.keys()
    assert not [k for k in state if "lm_head" in k or ".0.0." in k or ".ff." in k]
    adapter = create_model("otter", f"checkpoint={tmp_path / 'otter'},dtype=float32")
    rows = adapter.model.lang_encoder.get_input_embeddings().num_embeddings
    assert rows == state["lang_encoder.transformer.wte.weight"].shape[0] == len(adapter.tokenizer) + 7
    lm = adapter.model.lang_encoder
    assert lm.get_output_embeddings().weight.data_ptr() == lm.get_input_embeddings().weight.data_ptr()
    assert same_logits(adapter, written) <= 1e-5
    fp = adapter.fingerprint()
    assert fp["loaded"]["tied"] == 1 and fp["generated_tokens_attend"] == "last_image"  # Otter-MPT7B: no cache
    assert fp["vision_features"] == "patches" and fp["image_transform"] == {"name": "clip_processor", "size": 30}


def test_otter_llama_drops_stale_buffers_and_attends_generated_tokens_as_otter(corpus, tmp_path):
    written = write_random_flamingo(tmp_path / "otter", corpus, "otter", "llama")
    state = load_file(tmp_path / "otter" / "model.safetensors")
    stale = [k for k in state if k.endswith(("rotary_emb.inv_freq", "position_ids"))]
    assert len(stale) == 3 and "lang_encoder.lm_head.weight" in state
    adapter = create_model("otter", f"checkpoint={tmp_path / 'otter'},dtype=float32")
    assert adapter.fingerprint()["loaded"]["dropped"] == 3
    assert same_logits(adapter, written) <= 1e-5
    # LLaMA's config caches: as in Otter's code, tokens after the first generated one see no image
    assert adapter.fingerprint()["generated_tokens_attend"] == "no_image"
    no_cache = create_model("otter", f"checkpoint={tmp_path / 'otter'},dtype=float32,use_cache=false")
    assert no_cache.fingerprint()["generated_tokens_attend"] == "last_image"


@pytest.mark.parametrize("lm, extra_vocab, every", [("gpt_neox", 0, 2), ("mpt", 9, 1), ("llama", 0, 1)])
def test_openflamingo_checkpoint_as_its_training_script_saves_it(corpus, tmp_path, lm, extra_vocab, every):
    written = write_random_flamingo(tmp_path / lm, corpus, "openflamingo", lm, every, extra_vocab=extra_vocab)
    state = torch.load(tmp_path / lm / "checkpoint.pt", weights_only=True)
    assert {"perceiver.layers.0.0.to_q.weight", "perceiver.layers.0.1.1.weight"} <= state.keys()
    assert any(k.endswith(f".{every - 1}.gated_cross_attn_layer.ff.1.weight") for k in state)
    if lm == "gpt_neox":  # transformers 4's name of the output layer, which transformers 5 calls lm_head
        assert "lang_encoder.embed_out.weight" in state and not [k for k in state if "lm_head" in k]
    # OpenFlamingo's vision folder carries no processor config: its transform is open_clip's, built in
    assert not (tmp_path / lm / "vision" / "preprocessor_config.json").exists()
    if extra_vocab:  # MPT-7B's 50,432 rows for 50,277 tokens: the Hub LM is larger than the tokenizer
        config = json.loads((tmp_path / lm / "lang" / "config.json").read_text())
        assert config["vocab_size"] == len(written.tokenizer) - 2 + extra_vocab
    d = tmp_path / lm
    adapter = create_model("open_flamingo", f"checkpoint={d},lang_encoder={d / 'lang'},vision_encoder={d / 'vision'},"
                                            f"cross_attn_every_n_layers={every},dtype=float32")
    assert adapter.model.lang_encoder.get_input_embeddings().num_embeddings == len(written.tokenizer)
    # an untied output layer (LLaMA's lm_head) is not in the checkpoint: OpenFlamingo's own resize gives the rows
    # of <|endofchunk|> and <image> random values, so only the language model's own tokens can be compared
    own_tokens = slice(None, -2) if lm == "llama" else slice(None)
    assert same_logits(adapter, written, own_tokens) <= 1e-5
    fp = adapter.fingerprint()
    assert fp["vision_features"] == "patches" and fp["image_transform"] == {"name": "open_clip", "size": 30}
    assert adapter.eos_ids == {adapter.eoc_id}  # not the language model's own end of text


def test_ln_post_features_remain_an_option(corpus, tmp_path):
    written = write_random_flamingo(tmp_path / "of", corpus, "openflamingo", "mpt")
    d = tmp_path / "of"
    args = f"checkpoint={d},lang_encoder={d / 'lang'},vision_encoder={d / 'vision'},dtype=float32"
    default = create_model("open_flamingo", args)
    ln_post = create_model("open_flamingo", args + ",vision_features=ln_post_patches")
    assert same_logits(default, written) <= 1e-5 and same_logits(ln_post, written) > 0.1
    with pytest.raises(UserError, match="vision_features='cls' is not one of patches, ln_post_patches"):
        create_model("open_flamingo", args + ",vision_features=cls")


def test_otter_folder_without_a_tokenizer_names_the_fix(corpus, tmp_path):
    write_random_flamingo(tmp_path / "otter", corpus, "otter", "llama", tokenizer_in_folder=False)
    with pytest.raises(UserError, match="holds no tokenizer .* give one with --model-args tokenizer="):
        create_model("otter", f"checkpoint={tmp_path / 'otter'},dtype=float32")


def _noise(width: int, height: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(3).integers(0, 256, (height, width, 3), dtype=np.uint8))


def _normalised_crop(image: Image.Image, size: int, left: int, top: int) -> np.ndarray:
    mean, std = np.array([0.48145466, 0.4578275, 0.40821073]), np.array([0.26862954, 0.26130258, 0.27577711])
    pixels = np.asarray(image.crop((left, top, left + size, top + size)), np.float64) / 255
    return ((pixels - mean) / std).transpose(2, 0, 1)


def test_ek100_frames_are_cropped_where_each_original_crops():
    """456x256 -> 399x224 (bicubic); open_clip/torchvision crop at round(87.5)=88, CLIPImageProcessor at 87."""
    frame = _noise(456, 256)
    resized = frame.resize((399, 224), Image.Resampling.BICUBIC)
    open_clip = ImageTransform("open_clip", 224)([frame])[0].numpy()
    processor = ImageTransform("clip_processor", 224)([frame])[0].numpy()
    assert open_clip.shape == processor.shape == (3, 224, 224)
    assert np.abs(open_clip - _normalised_crop(resized, 224, 88, 0)).max() < 1e-5
    assert np.abs(processor - _normalised_crop(resized, 224, 87, 0)).max() < 1e-5
    assert np.abs(open_clip - _normalised_crop(resized, 224, 87, 0)).max() > 0.5
    # portrait: the offset is vertical (460x230 -> 448x224, crop at y=112)
    tall = _noise(230, 460)
    assert np.abs(ImageTransform("open_clip", 224)([tall])[0].numpy()
                  - _normalised_crop(tall.resize((224, 448), Image.Resampling.BICUBIC), 224, 0, 112)).max() < 1e-5
    with pytest.raises(UserError, match="image_transform='torchvision' is not one of open_clip, clip_processor"):
        ImageTransform("torchvision", 224)
