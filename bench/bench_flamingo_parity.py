"""Do our OpenFlamingo/Otter presets compute what the original code computes? A table of logit and token agreement.

``bench/flamingo_reference.py`` runs in a *separate* Python that has the
reference packages (open_flamingo 2.0.1, open_clip < 2.23, transformers 4,
and Otter's source): it builds tiny models with the originals' classes --
OpenFlamingo around GPT-NeoX, MPT and LLaMA language models, Otter around
its MosaicML MPT copy and LLaMA -- writes them as the originals write them
(OpenFlamingo's ``filter_state_dict_to_trainable`` checkpoint, Otter's
``save_pretrained`` folder) and records logits, greedy and 3-beam tokens on
one prompt with three EK-100-shaped frames. This script then loads each
through our presets (``openflamingo-4b``, ``openflamingo-9b``,
``otter-image-mpt7b``, ``otter-9b-incontext``, the preset's checkpoint
swapped for the tiny one) and compares:

* ``pixels``: our image transform on the same PNG frames vs the original's;
* ``logits``: max |difference| over every position and token, on the
  original's pixels (for an untied LLaMA output layer, which OpenFlamingo's
  checkpoint does not hold, the rows of the added tokens are random in
  the original on every load and are left out);
* ``steps``: max |difference| of the scores of every step of an 8-token
  greedy run (the original's pixels): from step 2 on, generated tokens read
  the key-value cache, and what they attend to (Otter-LLaMA: no image) shows;
* ``greedy``/``beam3``: the answers our adapter generates (its own pixels,
  its own decoding path) vs the original's: the same token ids up to the
  end of sequence and the same text.

Exit 0 only when every row has logits and pixels within 1e-4 and identical
answers. Nothing is installed into the project's environment. The reference
Python: ``--python`` (a venv with the packages), or ``--target DIR`` (a
``pip install --target DIR --no-deps open-flamingo==2.0.1
open-clip-torch==2.22.0 transformers==4.57.1 ...`` folder, put on this
Python's path for the child only; see docs/flamingo.md for what it needs on
CPU). Otter's source: ``--otter-git-dir`` (a clone's git directory) or
``--otter-source`` (its ``src/otter_ai/models`` folder).

Usage::

    PYTHONPATH=. python bench/bench_flamingo_parity.py --python /work/ref-venv/bin/python \\
        --otter-git-dir /work/.mirror/Luodian+Otter/repo
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOLERANCE = 1e-4
#: case -> (preset, its arguments for the tiny checkpoint)
PRESETS = {
    "of_gpt_neox": ("openflamingo-4b", {"cross_attn_every_n_layers": 2}),
    "of_mpt": ("openflamingo-9b", {"cross_attn_every_n_layers": 1}),
    "of_llama": ("open_flamingo", {"cross_attn_every_n_layers": 1}),  # OpenFlamingo v1's LM; no v2 preset
    "otter_mpt": ("otter-image-mpt7b", {}),
    "otter_llama": ("otter-9b-incontext", {}),
}


@dataclass
class Row:
    case: str
    preset: str
    pixels: float
    logits: float
    compared: str
    steps: float
    greedy: bool
    beam3: bool

    @property
    def ok(self) -> bool:
        return max(self.pixels, self.logits, self.steps) <= TOLERANCE and self.greedy and self.beam3


def build_reference(args, out: Path) -> None:
    python = args.python or sys.executable
    env = dict(os.environ)
    if args.target:
        env["PYTHONPATH"] = str(args.target)
    else:
        env.pop("PYTHONPATH", None)
    cmd = [python, str(HERE / "flamingo_reference.py"), "--out", str(out), "--cases", args.cases]
    cmd += ["--otter-source", str(args.otter_source)] if args.otter_source else ["--otter-git-dir",
                                                                                 str(args.otter_git_dir)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"reference build failed ({' '.join(cmd)}):\n{run.stderr[-4000:]}")


def compare(case: str, folder: Path, overrides: dict[str, str], show: bool) -> Row:
    import torch
    from PIL import Image

    from mmcomp_eval.api.request import GenerationRequest, GenerationSettings
    from mmcomp_eval.models import create_model
    from mmcomp_eval.models.decoding import decode_new

    preset, extra = PRESETS[case]
    if case.startswith("of_"):
        args = {"checkpoint": folder / "checkpoint.pt", "lang_encoder": folder / "lang",
                "vision_encoder": folder / "vision"}
    else:
        args = {"checkpoint": folder / "otter"}
    args = {**args, **extra, "dtype": "float32", **overrides}
    adapter = create_model(preset, ",".join(f"{k}={v}" for k, v in args.items()))
    ref = torch.load(folder / "reference.pt", weights_only=True)
    frames = [Image.open(folder / f"frame{k}.png").convert("RGB") for k in range(3)]
    prompt = adapter.tokenizer.decode(ref["input_ids"][0])  # the reference's prompt, as text
    batch = adapter.encode([prompt], [frames])
    if not torch.equal(batch["input_ids"], ref["input_ids"]):
        sys.exit(f"{case}: our tokenizer encodes the prompt differently: {batch['input_ids'].tolist()} vs "
                 f"{ref['input_ids'].tolist()}")
    pixels = float((batch["pixel_values"] - ref["pixels"]).abs().max())
    with torch.no_grad():
        logits = adapter.model(ref["pixels"], [3], ref["input_ids"], ref["attention_mask"]).logits
    columns, compared = slice(None), "all"
    if case == "of_llama":  # untied output rows of the added tokens (<|endofchunk|>, <image>, <PAD>): random there
        own = json.loads((folder / "lang" / "config.json").read_text())["vocab_size"]
        columns, compared = slice(None, own), f"LM's {own} tokens"
    width = min(logits.shape[-1], ref["logits"].shape[-1])
    diff = float((logits[..., :width] - ref["logits"][..., :width])[..., columns].abs().max())
    if logits.shape != ref["logits"].shape:
        sys.exit(f"{case}: logits shape {tuple(logits.shape)} vs the original's {tuple(ref['logits'].shape)}")
    steps = ref["step_scores"].shape[0]
    with torch.no_grad():  # our model's greedy step scores on the original's pixels (no end of sequence: all steps)
        run = adapter.model.generate(ref["pixels"], [3], ref["input_ids"], ref["attention_mask"], do_sample=False,
                                     max_new_tokens=steps, min_new_tokens=steps, num_beams=1, output_scores=True,
                                     return_dict_in_generate=True, eos_token_id=sorted(adapter.eos_ids),
                                     pad_token_id=adapter.tokenizer.pad_token_id)
    scores = torch.stack(run.scores, dim=1)[0]
    step_diff = finite_diff(scores[..., columns], ref["step_scores"][..., columns])
    generated = []  # the token ids our adapter's generate call returns (its text alone hides byte tokens' values)
    real_generate = adapter.model.generate

    def recording_generate(*a, **kw):
        out = real_generate(*a, **kw)
        generated.append(out[0, a[2].shape[1]:])
        return out

    adapter.model.generate = recording_generate
    agree = {}
    for name, settings in (("greedy", GenerationSettings(max_new_tokens=ref["greedy"].shape[0], stop=())),
                           ("beam3", GenerationSettings(max_new_tokens=ref["beam3"].shape[0], stop=(), num_beams=3,
                                                        length_penalty=0.0))):
        ours = adapter.generate([GenerationRequest("r", prompt, settings, images=("a#0", "a#1", "a#2"))],
                                images=[frames])[0]
        theirs = decode_new(adapter.tokenizer, ref[name][None], adapter.eos_ids, ())[0]
        agree[name] = ours == theirs and same_tokens(generated.pop(), ref[name], adapter.eos_ids)
        if show:
            print(f"{case} {name}: {ours!r}", file=sys.stderr)
        if ours != theirs:
            print(f"{case} {name}: ours {ours!r} vs original {theirs!r}", file=sys.stderr)
    return Row(case, preset, pixels, diff, compared, step_diff, agree["greedy"], agree["beam3"])


def finite_diff(ours, theirs) -> float:
    """Max |difference| where both are finite; inf if they mask (-inf) different entries (min_new_tokens masks eos)."""
    import torch

    finite = torch.isfinite(ours) & torch.isfinite(theirs)
    if not torch.equal(torch.isfinite(ours), torch.isfinite(theirs)):
        return float("inf")
    return float((ours - theirs)[finite].abs().max())


def same_tokens(ours, theirs, eos_ids: set[int]) -> bool:
    """The same ids up to and including the first end of sequence (what follows it is padding)."""
    def cut(row):
        row = row.tolist()
        return row[:next((k + 1 for k, t in enumerate(row) if t in eos_ids), len(row))]
    return cut(ours) == cut(theirs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_python = Path("/work/ref-venv/bin/python")
    parser.add_argument("--python", help="a Python with the reference packages "
                                         f"(default {default_python} if it exists, else this one with --target)")
    parser.add_argument("--target", type=Path, help="a pip --target folder with the reference packages")
    parser.add_argument("--otter-git-dir", type=Path, default=Path("/work/.mirror/Luodian+Otter/repo"))
    parser.add_argument("--otter-source", type=Path, help="Otter's src/otter_ai/models folder")
    parser.add_argument("--cases", default=",".join(PRESETS))
    parser.add_argument("--work", type=Path, help="where the tiny models go (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--reuse", action="store_true", help="compare against the models already in --work")
    parser.add_argument("--model-args", default="",
                        help="extra model arguments for every case (e.g. vision_features=ln_post_patches: "
                             "a check that the table notices a difference)")
    parser.add_argument("--show", action="store_true", help="print our answers")
    args = parser.parse_args()
    if not args.python and not args.target and default_python.exists():
        args.python = str(default_python)
    unknown = set(args.cases.split(",")) - set(PRESETS)
    if unknown:
        parser.error(f"unknown case(s) {', '.join(sorted(unknown))}; cases: {', '.join(PRESETS)}")
    work = args.work or Path(tempfile.mkdtemp(prefix="flamingo_parity_"))
    if not (args.reuse and (work / "cases.json").is_file()):
        build_reference(args, work)
    overrides = dict(kv.split("=", 1) for kv in args.model_args.split(",") if kv)
    rows = [compare(case, work / case, overrides, args.show) for case in args.cases.split(",")]
    head = f"{'case':<12} {'preset':<19} {'pixels max|d|':>13} {'logits max|d|':>13} {'logits over':<16} " \
           f"{'steps max|d|':>12} {'greedy':<7} {'beam3':<7} ok"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r.case:<12} {r.preset:<19} {r.pixels:>13.2e} {r.logits:>13.2e} {r.compared:<16} {r.steps:>12.2e} "
              f"{'same' if r.greedy else 'DIFF':<7} {'same' if r.beam3 else 'DIFF':<7} {'yes' if r.ok else 'NO'}")
    if args.json:
        args.json.write_text(json.dumps([{**r.__dict__, "ok": r.ok} for r in rows], indent=1))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
