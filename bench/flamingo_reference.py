"""The reference side of ``bench_flamingo_parity.py``: tiny models built and saved by the originals' own code.

Runs under a Python that has open_flamingo 2.0.1, open_clip (< 2.23) and
transformers 4 (never the project's environment: it imports nothing from
mmcomp_eval). For every case it builds a tiny model with the original's
classes, writes it the way the original writes it, and records on fixed
inputs what the original computes:

* OpenFlamingo (``of_*``): ``create_model_and_transforms`` on a tiny open_clip
  ViT (registered as a model config) and a tiny language model folder; the
  checkpoint is ``filter_state_dict_to_trainable(model, model.state_dict())``
  as OpenFlamingo's training script saves it. The vision tower is written as
  a transformers ``CLIPVisionModel`` folder (the same network as open_clip's
  ViT, as ``openai/clip-vit-large-patch14`` is for the released models).
* Otter (``otter_*``): ``OtterForConditionalGeneration`` from Otter's own
  source (its MosaicML MPT copy for MPT, transformers' LLaMA), written with
  its ``save_pretrained``; imports Otter needs only for LoRA and multi-GPU
  hooks (peft, accelerate) are stubbed when absent, and the Hub tokenizer
  Otter hard-codes for MPT is replaced by the tiny one.

Output per case under ``--out``: the model files, ``frame{k}.png`` and
``reference.pt`` (input ids, mask, pixels from the original's transform,
logits, greedy and 3-beam token ids, and the scores of
every step of a greedy run of ``NEW_TOKENS`` tokens).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import subprocess
import sys
import tarfile
import tempfile
import io
import types
from pathlib import Path

import numpy as np
import torch
from PIL import Image

CORPUS = [f"{verb} {noun}" for verb in ("take", "put down", "open", "close", "wash", "cut", "stir", "pick up")
          for noun in ("knife", "plate", "onion", "tap", "board", "pan", "fridge", "egg", "cupboard")]
PROMPT = "<image>take knife . <image>wash plate<|endofchunk|><image>open tap ."
NEW_TOKENS = 8
OTTER_PARTS = ("otter", "mpt", "mpt_redpajama", "falcon")
#: a tiny ViT in open_clip's config format (quick_gelu: the OpenAI weights' activation, as ViT-L-14 openai)
TINY_OPEN_CLIP = {"embed_dim": 16, "quick_gelu": True,
                  "vision_cfg": {"image_size": 30, "layers": 2, "width": 32, "head_width": 8, "mlp_ratio": 2.0,
                                 "patch_size": 10},
                  "text_cfg": {"context_length": 16, "vocab_size": 64, "width": 16, "heads": 2, "layers": 1}}
LMS = {
    "gpt_neox": dict(model_type="gpt_neox", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=1024, tie_word_embeddings=False),
    "mpt": dict(model_type="mpt", d_model=32, n_heads=4, n_layers=2, expansion_ratio=4, max_seq_len=1024),
    "llama": dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  tie_word_embeddings=False),
}


def tokenizer(folder: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(folder)
    return fast


def frames(folder: Path) -> list[Image.Image]:
    """Three EK-100-shaped (456x256) noise frames, saved for the other side."""
    rng = np.random.default_rng(12)
    out = []
    for k in range(3):
        image = Image.fromarray(rng.integers(0, 256, (256, 456, 3), dtype=np.uint8))
        image.save(folder / f"frame{k}.png")
        out.append(image)
    return out


def record(folder: Path, model, text_tokenizer, pixels, **generate_extra) -> None:
    """Logits, greedy and 3-beam continuations of PROMPT; ``pixels`` (T, C, H, W)."""
    enc = text_tokenizer([PROMPT], return_tensors="pt")
    vision_x = pixels[None, :, None]
    model.eval()
    with torch.no_grad():
        logits = model(vision_x=vision_x, lang_x=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
        runs = {}
        for name, extra in (("greedy", {"num_beams": 1}), ("beam3", {"num_beams": 3, "length_penalty": 0.0})):
            out = model.generate(vision_x, enc["input_ids"], attention_mask=enc["attention_mask"],
                                 max_new_tokens=NEW_TOKENS, do_sample=False, **extra, **generate_extra)
            runs[name] = out[0, enc["input_ids"].shape[1]:]
        # every greedy step's scores: what each generated token attended to shows from step 2 on
        steps = model.generate(vision_x, enc["input_ids"], attention_mask=enc["attention_mask"],
                               max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1,
                               output_scores=True, return_dict_in_generate=True, **generate_extra)
        runs["step_scores"] = torch.stack(steps.scores, dim=1)[0]
    torch.save({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "pixels": pixels,
                "logits": logits, **runs}, folder / "reference.pt")


def widen(modules, gate: float = 1.0) -> None:
    """Gates open (trained ones are not 0) so that images change the output."""
    with torch.no_grad():
        for module in modules:
            for name, param in module.named_parameters():
                if name.endswith(("attn_gate", "ff_gate")):
                    param.fill_(gate)


def openflamingo_case(out: Path, lm: str, every: int, extra_vocab: int) -> None:
    import open_clip
    from open_flamingo import create_model_and_transforms

    stub_if_absent("wandb", ())  # train_utils logs to it; filter_state_dict_to_trainable does not
    from open_flamingo.train.train_utils import filter_state_dict_to_trainable
    from transformers import AutoConfig, AutoModelForCausalLM, CLIPVisionConfig, CLIPVisionModel

    out.mkdir(parents=True)
    torch.manual_seed(0)
    tok = tokenizer(out / "lang")
    spec = dict(LMS[lm])
    config = AutoConfig.for_model(spec.pop("model_type"), vocab_size=len(tok) + extra_vocab, **spec,
                                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config.initializer_range = 0.5
    AutoModelForCausalLM.from_config(config).save_pretrained(out / "lang")
    open_clip.factory._MODEL_CONFIGS["tiny-vit"] = TINY_OPEN_CLIP
    model, image_processor, text_tokenizer = create_model_and_transforms(
        "tiny-vit", None, str(out / "lang"), str(out / "lang"), cross_attn_every_n_layers=every)
    visual = model.vision_encoder  # create_model_and_transforms keeps open_clip's .visual only
    with torch.no_grad():  # a trained tower's norms are not identity (ln_post matters then)
        for name, param in visual.named_parameters():
            if name.startswith(("ln_", "transformer.resblocks")) and param.dim() == 1:
                param.normal_(1.0 if name.endswith("weight") else 0.0, 0.3)
    widen([model.lang_encoder.gated_cross_attn_layers])
    torch.save(filter_state_dict_to_trainable(model, model.state_dict()), out / "checkpoint.pt")
    vcfg = TINY_OPEN_CLIP["vision_cfg"]
    hf = CLIPVisionModel(CLIPVisionConfig(
        hidden_size=vcfg["width"], intermediate_size=int(vcfg["width"] * vcfg["mlp_ratio"]),
        num_hidden_layers=vcfg["layers"], num_attention_heads=vcfg["width"] // vcfg["head_width"],
        image_size=vcfg["image_size"], patch_size=vcfg["patch_size"], hidden_act="quick_gelu",
        projection_dim=TINY_OPEN_CLIP["embed_dim"]))
    hf.load_state_dict(open_clip_to_hf(visual.state_dict()), strict=True)
    hf.save_pretrained(out / "vision")
    pixels = torch.stack([image_processor(im) for im in frames(out)])
    record(out, model, text_tokenizer, pixels)


def open_clip_to_hf(state: dict) -> dict:
    """open_clip ViT weights -> transformers ``CLIPVisionModel`` names (the layout HF's conversion script maps)."""
    out = {"vision_model.embeddings.patch_embedding.weight": state["conv1.weight"],
           "vision_model.embeddings.class_embedding": state["class_embedding"],
           "vision_model.embeddings.position_embedding.weight": state["positional_embedding"],
           "vision_model.pre_layrnorm.weight": state["ln_pre.weight"], "vision_model.pre_layrnorm.bias": state["ln_pre.bias"],
           "vision_model.post_layernorm.weight": state["ln_post.weight"],
           "vision_model.post_layernorm.bias": state["ln_post.bias"]}
    layers = {int(k.split(".")[2]) for k in state if k.startswith("transformer.resblocks.")}
    for i in layers:
        src, dst = f"transformer.resblocks.{i}.", f"vision_model.encoder.layers.{i}."
        for a, b in (("ln_1", "layer_norm1"), ("ln_2", "layer_norm2"), ("mlp.c_fc", "mlp.fc1"),
                     ("mlp.c_proj", "mlp.fc2"), ("attn.out_proj", "self_attn.out_proj")):
            for p in ("weight", "bias"):
                out[f"{dst}{b}.{p}"] = state[f"{src}{a}.{p}"]
        for p in ("weight", "bias"):
            q, k, v = state[f"{src}attn.in_proj_{p}"].chunk(3)
            out.update({f"{dst}self_attn.q_proj.{p}": q, f"{dst}self_attn.k_proj.{p}": k,
                        f"{dst}self_attn.v_proj.{p}": v})
    return out


def stub_if_absent(name: str, attrs: tuple[str, ...]) -> None:
    """An empty module for an import the code paths run here never use (training logs, LoRA, device hooks)."""
    try:
        __import__(name)
    except ImportError:
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        for attr in attrs:
            setattr(module, attr, None)
        sys.modules[name] = module


def import_otter(source: Path, git_dir: Path | None, work: Path):
    """Otter's model package from its source tree (or its git directory), importable without its training deps."""
    root = work / "otter_ref"
    models = root / "models"
    if git_dir is not None:
        archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "HEAD",
                                  *[f"src/otter_ai/models/{p}" for p in OTTER_PARTS]], check=True,
                                 capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(work / "otter_src", filter="data")
        source = work / "otter_src" / "src" / "otter_ai" / "models"
    models.mkdir(parents=True)
    for part in OTTER_PARTS:
        subprocess.run(["cp", "-r", str(source / part), str(models / part)], check=True)
    (root / "__init__.py").write_text("")
    (models / "__init__.py").write_text("")  # Otter's imports its other models too
    import transformers  # noqa: F401  (reads which packages exist before the stubs below appear)

    # used by Otter only for LoRA and multi-device hooks, never here
    stub_if_absent("peft", ("LoraConfig", "TaskType", "get_peft_model"))
    stub_if_absent("accelerate", ())
    stub_if_absent("accelerate.hooks", ("AlignDevicesHook", "add_hook_to_module"))
    sys.path.insert(0, str(work))
    from transformers import GenerationMixin

    from otter_ref.models.otter import modeling_otter

    # transformers >= 4.50 models get generate() only by inheriting GenerationMixin, which Otter's MosaicML MPT
    # copy (written for 4.30) does not name; the same class under the same name (Otter dispatches on it) with it
    mpt = modeling_otter.MPTForCausalLM
    modeling_otter.MPTForCausalLM = type(mpt.__name__, (mpt, GenerationMixin), {})
    return modeling_otter


def otter_case(out: Path, lm: str, every: int, extra_vocab: int, modeling_otter) -> None:
    from transformers import CLIPImageProcessor

    out.mkdir(parents=True)
    torch.manual_seed(0)
    tok_dir = out / "llama-tokenizer"  # Otter loads a LLaMA's tokenizer from text_config._name_or_path
    tok = tokenizer(tok_dir)
    real_from_pretrained = modeling_otter.AutoTokenizer.from_pretrained

    def tokenizer_for(name, *args, **kwargs):  # Otter hard-codes mosaicml/mpt-7b-instruct for MPT
        return real_from_pretrained(str(tok_dir) if name == "mosaicml/mpt-7b-instruct" else name, *args, **kwargs)

    modeling_otter.AutoTokenizer.from_pretrained = tokenizer_for
    # Otter adds 3 tokens and <PAD> (this tokenizer has none) and never resizes: the config's rows must hold them
    # (Otter-MPT7B: 50,432 rows for 50,281 tokens)
    rows = len(tok) + 3 + (tok.pad_token is None) + extra_vocab
    if lm == "mpt":
        text = {"architectures": ["MPTForCausalLM"], "model_type": "mpt", "d_model": 32, "hidden_size": 32, "n_heads": 4,
                "n_layers": 2, "expansion_ratio": 4, "max_seq_len": 1024, "vocab_size": rows, "use_cache": False,
                "attn_config": {"attn_impl": "torch", "alibi": True}, "init_device": "cpu", "no_bias": True,
                "_name_or_path": "mosaicml/mpt-7b-instruct"}
    else:
        text = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **{k: v for k, v in LMS[lm].items()
                                                                               if k != "model_type"},
                "vocab_size": rows, "_name_or_path": str(tok_dir)}
    vision = {"hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 1, "num_attention_heads": 16,
              "image_size": 30, "patch_size": 10}  # Otter's perceiver is built for 1024 features
    config = modeling_otter.OtterConfig(vision_config=vision, text_config=text, cross_attn_every_n_layers=every)
    model = modeling_otter.OtterForConditionalGeneration(config)
    with torch.no_grad():
        for name, param in model.lang_encoder.named_parameters():
            if "gated_cross_attn_layer" not in name and param.dim() == 2:
                param.normal_(0.0, 0.5)
        for name, param in model.vision_encoder.named_parameters():
            if "layer_norm" in name or "layrnorm" in name or "layernorm" in name:
                param.normal_(1.0 if name.endswith("weight") else 0.0, 0.3)
    widen([model.lang_encoder])
    # transformers 4.57's save_pretrained builds a default OtterConfig() (to diff against and to find generation
    # settings), which Otter's config class, written for transformers 4.30, cannot: write the config whole
    modeling_otter.OtterConfig._get_non_default_generation_parameters = lambda self: {}
    modeling_otter.OtterConfig.has_no_defaults_at_init = True
    model.save_pretrained(out / "otter")
    model.text_tokenizer.save_pretrained(out / "otter")  # as the released repos carry it
    processor = CLIPImageProcessor(size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30})
    pixels = processor(images=frames(out), return_tensors="pt")["pixel_values"]
    record(out, model, model.text_tokenizer, pixels)


CASES = {  # name -> (kind, language model, cross-attention every n layers, extra embedding rows)
    "of_gpt_neox": ("openflamingo", "gpt_neox", 2, 0),
    "of_mpt": ("openflamingo", "mpt", 1, 9),
    "of_llama": ("openflamingo", "llama", 1, 0),
    "otter_mpt": ("otter", "mpt", 1, 7),
    "otter_llama": ("otter", "llama", 2, 0),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--otter-git-dir", type=Path)
    parser.add_argument("--otter-source", type=Path, help="Otter's src/otter_ai/models folder")
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    modeling_otter = None
    for name in args.cases.split(","):
        kind, lm, every, extra = CASES[name]
        if kind == "openflamingo":
            openflamingo_case(args.out / name, lm, every, extra)
        else:
            if modeling_otter is None:
                modeling_otter = import_otter(args.otter_source, args.otter_git_dir, Path(tempfile.mkdtemp()))
            otter_case(args.out / name, lm, every, extra, modeling_otter)
        print(f"reference {name}: written", flush=True)
    (args.out / "cases.json").write_text(json.dumps({n: CASES[n] for n in args.cases.split(",")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
