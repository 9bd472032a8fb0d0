"""OpenFlamingo and Otter, rebuilt natively from transformers parts (``--model open_flamingo`` / ``otter``).

The projects' own packages pin torch 2.0.1 and transformers 4.35.1, so
their code cannot run beside ours. A Flamingo model is small glue around
parts transformers already has, so it is rebuilt here, one file a part:

* ``vision.py``: a CLIP vision tower (``CLIPVisionModel``; OpenFlamingo's
  open_clip ``ViT-L-14``/``openai`` is the same network as the Hub's
  ``openai/clip-vit-large-patch14``), whose patch tokens feed
* ``resampler.py``: a Perceiver resampler (64 latents per image), whose output is read by
* ``cross_attention.py``: gated cross-attention blocks placed before every
  n-th decoder layer of an unmodified transformers causal LM,
* ``model.py``: the module that ties them together with forward pre-hooks;
* ``checkpoint.py``: the released checkpoints' weight names (OpenFlamingo v2's
  ``perceiver.layers.0.0.to_q.weight``, Otter's ``perceiver.layers.0.to_q.weight``,
  the language model's names as its transformers version wrote them) mapped onto ours;
* ``images.py``: each original's image transform (open_clip's or ``CLIPImageProcessor``'s crop);
* ``loading.py``: the two release formats; ``prompt.py``: ``<|endofchunk|>``, ``<answer>``;
* ``adapter.py``: the ``open_flamingo`` and ``otter`` adapters, presets and decoding defaults.

Only ``adapter.py`` and what it imports at the top are loaded with
``mmcomp_eval.models``; the torch modules are imported when a model is built.

``bench/bench_flamingo_parity.py`` checks tiny models built and saved by the
originals' own code (open_flamingo 2.0.1, Otter's source) against these
(``docs/flamingo.md``). Not verified here (no network, no weights): the
released checkpoints themselves.
"""

from mmcomp_eval.models.flamingo import adapter  # noqa: F401  (registers "open_flamingo", "otter" and presets)
