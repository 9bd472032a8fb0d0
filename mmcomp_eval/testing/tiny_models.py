"""Tiny random-weight models for tests and benchmarks: every local adapter's real code path, no downloads.

Scores from these models mean nothing; they exercise loading, prompting,
batching and decoding exactly as a real checkpoint would. Each builder is
deterministic (seeded), so tests can compare answers across runs, batch
sizes and processes. Kept out of the adapters: production code never builds
a random model.

* :func:`save_tiny_llama`: a 2-layer Llama with a real tokenizer (SmolLM2's in
  the test suite), for the ``hf`` adapter.
* :func:`random_tokenizer`: a byte-level BPE trained on a corpus, for the VLMs.
* :func:`random_idefics` / :func:`save_random_idefics`: IDEFICS, tiny or with
  idefics-9b's shapes (GPU throughput checks without the weights).
* :func:`save_random_flamingo` / :func:`write_random_flamingo`: OpenFlamingo or Otter in their release formats.
* image-text-to-text models for ``hf_vlm`` (Idefics2, Idefics3, LLaVA, LLaVA-NeXT,
  Qwen2-VL): :mod:`mmcomp_eval.testing.tiny_image_text`.
* :func:`save_tiny_clip` / :func:`save_tiny_clap`: CLIP and CLAP checkpoints for the
  retrieval models (``clip``, ``fusion``).

torch and transformers are imported inside the builders.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmcomp_eval.models.flamingo.prompt import END_OF_CHUNK
from mmcomp_eval.tasks.prompting import IMAGE_PLACEHOLDER


def save_tiny_llama(folder: Path, tokenizer_source: str | Path, max_position_embeddings: int = 512,
                    seed: int = 0) -> Path:
    """A 2-layer random Llama (hidden size 32) with the tokenizer at ``tokenizer_source``, saved as an HF folder.

    The weights are spread wide (``initializer_range=0.5``) so that answers
    differ between prompts.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True, initializer_range=0.5)
    torch.manual_seed(seed)
    folder = Path(folder)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def random_tokenizer(corpus: Sequence[str], vocab_size: int = 400, pad_to: int | None = None,
                     extra_special: Sequence[str] = ()):
    """A byte-level BPE tokenizer trained on ``corpus`` (offline, deterministic, any text encodes).

    ``pad_to`` adds filler tokens until the vocabulary has that many entries
    (so that ``extra_special`` get ids at or above it, like a real
    checkpoint's added tokens). Returns the tokenizer and the id of the first
    ``extra_special`` token.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(corpus), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<unk>")
    if pad_to is not None and pad_to > len(fast):
        fast.add_tokens([f"<filler_{i}>" for i in range(pad_to - len(fast))])
    first_special = len(fast)
    if extra_special:
        fast.add_special_tokens({"additional_special_tokens": list(extra_special)})
    return fast, first_special


IDEFICS_9B = dict(  # HuggingFaceM4/idefics-9b config.json (LLaMA-7B + CLIP ViT-H/14 + perceiver)
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, cross_layer_interval=4, max_position_embeddings=2048, rms_norm_eps=1e-6,
    use_resampler=True, qk_layer_norms=False, tie_word_embeddings=False,
    vision_config=dict(embed_dim=1280, image_size=224, patch_size=14, num_hidden_layers=32, num_attention_heads=16,
                       intermediate_size=5120, hidden_act="gelu"),
    perceiver_config=dict(use_resampler=True, resampler_n_latents=64, resampler_depth=6, resampler_n_heads=16,
                          resampler_head_dim=96, qk_layer_norms_perceiver=False),
)
IDEFICS_TINY = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, cross_layer_interval=1,
    max_position_embeddings=2048, use_resampler=True,
    vision_config=dict(embed_dim=32, image_size=30, patch_size=10, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64),
    perceiver_config=dict(use_resampler=True, resampler_n_latents=4, resampler_depth=1, resampler_n_heads=2,
                          resampler_head_dim=8),
)
IDEFICS_SPECIAL = ("<fake_token_around_image>", "<image>", "<end_of_utterance>")


def random_idefics(corpus: Sequence[str], size: str = "tiny", seed: int = 0, dtype: str = "float32",
                   device: str = "cpu"):
    """A random-weight IDEFICS and its processor, built in memory on ``device``.

    ``size="9b"`` has idefics-9b's shapes (about 9 billion parameters, a
    32,000-token vocabulary padded with filler tokens): for throughput and
    memory checks where the real weights are absent. The special tokens get
    ids past ``vocab_size``, i.e. IDEFICS's "additional" embeddings, as in
    the real checkpoints. The gates start at 1 (IDEFICS trains them from 0)
    so that images change the output, which is what the tests check.
    """
    import torch
    from transformers import IdeficsConfig, IdeficsForVisionText2Text, IdeficsImageProcessor, IdeficsProcessor

    spec = {"tiny": IDEFICS_TINY, "9b": IDEFICS_9B}[size]
    tokenizer, vocab = random_tokenizer(corpus, vocab_size=400 if size == "tiny" else 2000,
                                        pad_to=spec.get("vocab_size"), extra_special=IDEFICS_SPECIAL)
    config = IdeficsConfig(**{**spec, "vocab_size": vocab, "additional_vocab_size": len(IDEFICS_SPECIAL)},
                           bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id, alpha_initializer="ones",
                           initializer_range=0.5 if size == "tiny" else 0.02)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))  # parameters are created in ``dtype``: no float32 copy of 9B
    try:
        with torch.device(device):
            model = IdeficsForVisionText2Text(config).eval()
    finally:
        torch.set_default_dtype(previous)
    image_size = spec["vision_config"]["image_size"]
    processor = IdeficsProcessor(IdeficsImageProcessor(image_size=image_size), tokenizer, image_size=image_size)
    return model, processor


def save_random_idefics(folder: Path, corpus: Sequence[str], size: str = "tiny", seed: int = 0,
                        dtype: str = "float32") -> Path:
    """:func:`random_idefics` saved as a folder loadable with ``pretrained=folder``."""
    model, processor = random_idefics(corpus, size, seed, dtype)
    folder = Path(folder)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


#: language models of :func:`save_random_flamingo` (MPT, RedPajama/GPT-NeoX and LLaMA back the released models;
#: like theirs, the LLaMA and GPT-NeoX output layers are untied, MPT's is its input embedding)
TINY_LMS = {
    "llama": dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False),
    "gpt_neox": dict(model_type="gpt_neox", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=1024, tie_word_embeddings=False),
    "mpt": dict(model_type="mpt", d_model=32, n_heads=4, n_layers=2, expansion_ratio=4, max_seq_len=1024),
}
#: the vision tower of :func:`save_random_flamingo`
TINY_CLIP = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=30,
                 patch_size=10, hidden_act="quick_gelu")


@dataclass
class WrittenFlamingo:
    """What :func:`write_random_flamingo` wrote, and the model it wrote (to compare a loaded copy's outputs with)."""

    folder: Path
    model: Any  # mmcomp_eval.models.flamingo.model.Flamingo, the weights as written
    tokenizer: Any  # with the Flamingo tokens added, as the loaders add them


def save_random_flamingo(folder: Path, corpus, fmt: str = "openflamingo", lm: str = "llama",
                         cross_attn_every_n_layers: int = 1, seed: int = 0, extra_vocab: int = 0,
                         tokenizer_in_folder: bool = True) -> Path:
    """:func:`write_random_flamingo`'s folder."""
    return write_random_flamingo(folder, corpus, fmt, lm, cross_attn_every_n_layers, seed, extra_vocab,
                                 tokenizer_in_folder).folder


def write_random_flamingo(folder: Path, corpus, fmt: str = "openflamingo", lm: str = "llama",
                          cross_attn_every_n_layers: int = 1, seed: int = 0, extra_vocab: int = 0,
                          tokenizer_in_folder: bool = True) -> WrittenFlamingo:
    """A tiny random Flamingo written as the original's code writes it, loadable by the ``open_flamingo``/``otter`` adapters.

    ``openflamingo``: ``lang/`` (LM + tokenizer as on the Hub, before the
    special tokens; the LM has ``extra_vocab`` rows beyond the tokenizer, as
    MPT-7B's 50,432 for 50,277 tokens), ``vision/`` (the CLIP tower alone, no
    ``preprocessor_config.json``: OpenFlamingo takes its transform from
    open_clip) and ``checkpoint.pt`` as OpenFlamingo's training script
    filters and names it, after resizing the LM to the tokenizer with
    ``<|endofchunk|>`` and ``<image>`` (see ``flamingo_formats.py``).
    ``otter``: one folder as Otter's ``save_pretrained`` writes it:
    ``config.json`` (``text_config`` with ``use_cache: false`` for MPT as in
    Otter's MPT-7B config), ``model.safetensors`` under Otter's names, the
    tokenizer with ``<|endofchunk|>``, ``<image>``, ``<answer>`` (unless
    ``tokenizer_in_folder`` is false) and no image processor; the LM is not
    resized, so ``extra_vocab`` rows stay (Otter-MPT7B: 50,432).
    The gates start at 1 (trained checkpoints learn them from 0) and the
    new layers are initialised as widely as the LM, so that images change
    the output.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, CLIPVisionConfig, CLIPVisionModel

    from mmcomp_eval.models.flamingo.model import Flamingo
    from mmcomp_eval.models.flamingo.prompt import ANSWER
    from mmcomp_eval.testing.flamingo_formats import openflamingo_checkpoint, otter_state

    folder = Path(folder)
    torch.manual_seed(seed)
    tokenizer, _ = random_tokenizer(corpus)
    specials = [END_OF_CHUNK, IMAGE_PLACEHOLDER] + ([ANSWER] if fmt == "otter" else [])
    spec = dict(TINY_LMS[lm])
    rows = len(tokenizer) + (len(specials) if fmt == "otter" else 0) + extra_vocab
    lm_config = AutoConfig.for_model(spec.pop("model_type"), vocab_size=rows, **spec,
                                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                     pad_token_id=tokenizer.pad_token_id)
    lm_config.initializer_range = 0.5
    language = AutoModelForCausalLM.from_config(lm_config)
    vision = CLIPVisionModel(CLIPVisionConfig(**TINY_CLIP))
    with torch.no_grad():  # a trained CLIP's ln_post is far from identity: features with and without it differ
        ln_post = next(m for name, m in vision.named_modules() if name.endswith("post_layernorm"))
        ln_post.weight.normal_(1.0, 0.5)
        ln_post.bias.normal_(0.0, 0.5)
    if fmt == "openflamingo":
        language.save_pretrained(folder / "lang")
        tokenizer.save_pretrained(folder / "lang")
        vision.save_pretrained(folder / "vision")
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    if fmt == "openflamingo":  # create_model_and_transforms resizes to the tokenizer (down, here)
        language.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    model = Flamingo(vision, language, tokenizer.convert_tokens_to_ids(IMAGE_PLACEHOLDER), cross_attn_every_n_layers)
    with torch.no_grad():  # the new parts get the LM's spread (0.5), so images visibly change the output
        for block in [*model.gated_cross_attn_layers, model.perceiver]:
            if block is not None:
                for name, param in block.named_parameters():
                    if name.endswith("gate"):
                        param.fill_(1.0)
                    elif param.dim() == 2 and "latents" not in name:
                        param.normal_(0.0, 0.5)
    if fmt == "openflamingo":
        torch.save(openflamingo_checkpoint(model), folder / "checkpoint.pt")
        return WrittenFlamingo(folder, model, tokenizer)
    folder.mkdir(parents=True, exist_ok=True)
    text_config = {**language.config.to_dict(), **({"use_cache": False} if lm == "mpt" else {})}
    (folder / "config.json").write_text(json.dumps({
        "model_type": "otter", "cross_attn_every_n_layers": cross_attn_every_n_layers,
        "vision_config": vision.config.to_dict(), "text_config": text_config}, indent=1))
    save_file(otter_state(model), folder / "model.safetensors")
    if tokenizer_in_folder:
        tokenizer.save_pretrained(folder)
    return WrittenFlamingo(folder, model, tokenizer)


# -- retrieval: CLIP and CLAP ------------------------------------------------------------------------------


def _byte_chars() -> list[str]:
    """GPT-2/CLIP byte-level alphabet: every byte as a printable character."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def tiny_clip_tokenizer(merge_words: Sequence[str] = ("a", "the", "car", "sea", "sun", "red")):
    """A real CLIP BPE tokenizer over a tiny vocabulary: bytes, bytes + ``</w>``, and merges for ``merge_words``."""
    from transformers import CLIPTokenizer

    chars = _byte_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({c + "</w>": len(chars) + i for i, c in enumerate(chars)})
    merges = []
    for word in merge_words:
        cur = word[0]
        for k, ch in enumerate(word[1:], start=1):
            nxt = ch + ("</w>" if k == len(word) - 1 else "")
            merges.append((cur, nxt))
            cur += nxt
            vocab.setdefault(cur, len(vocab))
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)


def save_tiny_clip(folder: Path, seed: int = 0, projection_dim: int = 16) -> Path:
    """A 2-layer random CLIP (32x32 images, ``projection_dim``-d joint space) with its tokenizer and image processor.

    A complete checkpoint folder: the ``clip`` and ``fusion`` models load it
    through the same code as ``openai/clip-vit-base-patch32``.
    """
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    tok = tiny_clip_tokenizer()
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    config = CLIPConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=77, bos_token_id=eos - 1,
                         eos_token_id=eos, pad_token_id=eos),
        vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48,
                           num_hidden_layers=2, num_attention_heads=4),
        projection_dim=projection_dim)
    torch.manual_seed(seed)
    folder = Path(folder)
    CLIPModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


def save_tiny_clap(folder: Path, seed: int = 0, projection_dim: int = 16) -> Path:
    """A random CLAP (1 s of 16 kHz audio, a byte-level RoBERTa tokenizer with 78 text positions) as a checkpoint folder."""
    import torch
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel, RobertaTokenizer

    chars = _byte_chars()
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({c: i + 4 for i, c in enumerate(chars)})
    vocab["<mask>"] = len(vocab)
    tok = RobertaTokenizer(vocab=vocab, merges=[])
    config = ClapConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=80, type_vocab_size=1, pad_token_id=1,
                         bos_token_id=0, eos_token_id=2),
        audio_config=dict(num_mel_bins=16, spec_size=64, window_size=4, patch_size=4, patch_stride=(4, 4),
                          depths=[1, 1], num_attention_heads=[1, 2], hidden_size=32, patch_embeds_hidden_size=16,
                          num_hidden_layers=2, enable_fusion=False),
        projection_dim=projection_dim)
    torch.manual_seed(seed)
    folder = Path(folder)
    ClapModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    ClapFeatureExtractor(feature_size=16, sampling_rate=16000, hop_length=160, max_length_s=1, fft_window_size=1024,
                         frequency_max=8000, truncation="rand_trunc").save_pretrained(folder)
    return folder
