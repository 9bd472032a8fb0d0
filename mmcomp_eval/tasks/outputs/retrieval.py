"""``output_type: retrieval``: text-video retrieval in both directions (ICSVR, SAVE).

The task's loader gives one document per caption with its video
(``retrieval.text_field``, ``target_field``); the gallery is those videos in
order of first appearance, found as files in the ``retrieval:`` folders
when the task is prepared. The task is scored on one document per *query*:

* ``t2v:<caption id>`` for each caption (text-to-video: it ranks the videos);
* ``v2t:<video id>`` for each gallery video (video-to-text: it ranks the
  captions, by caption set under ``best_caption``, see
  :mod:`mmcomp_eval.retrieval.ranking`).

Each seed asks the model (``embed``) for every caption as that seed has it
and for every gallery video, ranks with the dot product of the answers (after
the model's :meth:`~mmcomp_eval.api.model.Model.score_vectors`), and
predicts, per query, the rank of its relevant item: the retrieval metrics
(``t2v_r1`` ... ``v2t_sumr``) summarise those ranks. A task with a
``perturbation:`` perturbs every caption with the run's seed (so ``--seeds
3`` gives three perturbation draws, mean and std over them), keeping the
videos as they are: the response store embeds each video once per model and
frame settings, and each distinct caption text once.

``--limit N`` keeps the first N gallery videos and their captions: a smaller
gallery, where R@k rise and ranks fall, so such numbers are not comparable
with the full task's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from mmcomp_eval.api.document import Document
from mmcomp_eval.api.model import Model, ModelCapabilities
from mmcomp_eval.api.request import EmbeddingRequest
from mmcomp_eval.api.task import ModelCall, OutputType, limited
from mmcomp_eval.config.task_config import one_of
from mmcomp_eval.errors import UserError
from mmcomp_eval.media.video import FRAME_SAMPLINGS
from mmcomp_eval.retrieval.gallery import gallery_inputs, resolve_folders
from mmcomp_eval.retrieval.ranking import TIE_RULE, TIE_RULE_DESCRIPTION, V2T_CONVENTIONS, score_embeddings
from mmcomp_eval.tasks.loaders import load_documents
from mmcomp_eval.tasks.outputs.registry import OUTPUT_TYPES
from mmcomp_eval.tasks.prompting import RenderedPrompt


@OUTPUT_TYPES.register("retrieval")
class Retrieval(OutputType):
    """Captions and gallery videos embedded, ranked both ways; each query's prediction is its relevant item's rank."""

    name = "retrieval"
    prompted = False

    @classmethod
    def check_config(cls, task, where: str) -> None:
        from mmcomp_eval.metrics import METRICS

        s = task.retrieval
        if s is None:
            raise UserError(f"{where}: output_type 'retrieval' needs a 'retrieval' section naming the gallery "
                            "(videos_dir and/or features_dir; see docs/retrieval.md)")
        one_of(where, "retrieval.v2t", s.v2t, tuple(V2T_CONVENTIONS))
        one_of(where, "retrieval.frame_sampling", s.frame_sampling, tuple(FRAME_SAMPLINGS))
        if task.fewshot.k:
            raise UserError(f"{where}: retrieval tasks take no few-shot examples; remove fewshot.k")
        if task.media is not None:
            raise UserError(f"{where}: 'media' holds EK-100 keyframe settings; a retrieval task names its gallery "
                            "under 'retrieval' (videos_dir, features_dir, audio_dir, transcripts)")
        for mc in task.metrics:
            if mc.name in METRICS and "retrieval" not in (METRICS.get(mc.name).output_types or ()):
                raise UserError(f"{where}: metric '{mc.name}' scores answer text, not ranks; use the retrieval "
                                "metrics (t2v_r1, t2v_r5, t2v_r10, t2v_mdr, t2v_mnr, t2v_sumr and v2t_*)")
        p = task.perturbation
        if p is not None and p.field != s.text_field:
            raise UserError(f"{where}: perturbation.field is '{p.field}' but the captions are in "
                            f"retrieval.text_field '{s.text_field}'; perturb the captions")
        if p is not None and p.seed != 0:
            raise UserError(f"{where}: perturbation.seed {p.seed}: a retrieval task perturbs with the run's seed "
                            "(--seed/--seeds); remove the key")

    @classmethod
    def model_problem(cls, capabilities: ModelCapabilities) -> str | None:
        return None if capabilities.embeddings else "cannot embed captions and videos (use clip, fusion or a preset)"

    def __init__(self, task, data):
        super().__init__(task, data)
        self.settings = task.retrieval
        self.data = data
        self.where = f"task {task.task}"
        self.folders = resolve_folders(self.settings, Path(task.source).parent if task.source else None, self.where)
        self.gallery: list = []
        self.videos: tuple[str, ...] = ()
        self.caption_ids: tuple[str, ...] = ()
        self.captions: tuple[str, ...] = ()
        self.caption_video = np.zeros(0, dtype=np.int64)
        self.n_listed_videos = 0
        self.perturbations: dict[int, dict[str, Any]] = {}
        self.similarity: str | None = None
        self._vocabulary: Any = None

    # -- documents ------------------------------------------------------------------------------------------

    def documents(self, split: str, limit: int | float | None) -> list[Document]:
        """One document per caption (``t2v:``), then one per gallery video (``v2t:``); the gallery's files found."""
        task, field = self.task, self.settings.text_field
        loaded = load_documents(replace(task, perturbation=None), split, self.data)  # perturbed per seed instead
        for d in loaded:
            if not isinstance(d.get(field), str):
                raise UserError(f"{self.where}: document {d.id} has no text field '{field}' (retrieval.text_field)")
        order = list(dict.fromkeys(str(d[task.target_field]) for d in loaded))
        self.n_listed_videos = len(order)
        order = order[: limited(len(order), limit)]  # --limit counts gallery videos (a fraction of them below 1)
        keep = set(order)
        captions = [d for d in loaded if str(d[task.target_field]) in keep]
        if not captions:
            raise UserError(f"{self.where}: split '{split}' has no captions")
        index = {v: j for j, v in enumerate(order)}
        self.videos = tuple(order)
        self.caption_ids = tuple(d.id for d in captions)
        self.captions = tuple(d[field] for d in captions)
        self.caption_video = np.array([index[str(d[task.target_field])] for d in captions], dtype=np.int64)
        self._all_texts = tuple(d[field] for d in loaded)  # the vocabulary of a loader that is no caption dataset
        self.gallery = gallery_inputs(self.videos, self.folders, n_frames=self.settings.n_frames,
                                      frame_sampling=self.settings.frame_sampling, where=self.where)
        per_video: list[list[str]] = [[] for _ in order]
        for cid, j in zip(self.caption_ids, self.caption_video):
            per_video[j].append(cid)
        return ([Document(f"t2v:{d.id}", {**d.fields, "direction": "t2v"}) for d in captions]
                + [Document(f"v2t:{v}", {"direction": "v2t", task.target_field: v, "caption_ids": ids})
                   for v, ids in zip(order, per_video)])

    def inputs(self, docs: list[Document], seed: int) -> list[RenderedPrompt]:
        """A caption query stands for its caption as this seed has it; a video query for nothing textual."""
        texts = self._captions_for_seed(seed)
        return [RenderedPrompt(t, None, ()) for t in texts] + [RenderedPrompt("", None, ()) for _ in self.videos]

    def _captions_for_seed(self, seed: int) -> tuple[str, ...]:
        p = self.task.perturbation
        if p is None:
            return self.captions
        from mmcomp_eval.perturb import perturb_captions
        from mmcomp_eval.perturb.documents import task_vocabulary

        if self._vocabulary is None:  # a caption dataset's every caption, else the whole split file's
            self._vocabulary = task_vocabulary(self.task) or self._all_texts
        run = perturb_captions(self.captions, p.kind, seed=seed, keys=self.caption_ids, spacy_model=p.spacy_model,
                               pos_roles=p.pos_roles, vocabulary=self._vocabulary)
        result = run[p.kind]
        self.perturbations[seed] = {"n_unchanged": result.n_unchanged, "n_empty": len(result.empty),
                                    "settings": {k: v for k, v in run.settings().items() if k != "seed"}}
        return result.captions

    # -- asking and reading ---------------------------------------------------------------------------------

    def requests(self, prepared, seed: int) -> ModelCall:
        """Every caption of this seed, then every gallery video (sliced alike by a data-parallel run)."""
        texts = [p.text for p in prepared.prompts[seed][:len(self.caption_ids)]]
        tokens = self.settings.max_text_tokens
        reqs = [EmbeddingRequest(f"text:{cid}", text=t, max_text_tokens=tokens)
                for cid, t in zip(self.caption_ids, texts)]
        reqs += [EmbeddingRequest(f"video:{v.video_id}", video=v) for v in self.gallery]
        return ModelCall("embed", reqs)

    def read(self, answers: Sequence[Any], model: Model) -> tuple[list, list[str]]:
        """Rank both directions; per query (t2v, then v2t) its rank as the prediction and what it retrieved first."""
        n = len(self.caption_ids)
        if len(answers) != n + len(self.videos):
            raise ValueError(f"{len(answers)} embeddings for {n} captions and {len(self.videos)} videos")
        captions, videos = model.score_vectors(np.stack(answers[:n]), np.stack(answers[n:]))
        self.similarity = model.similarity()
        scores = score_embeddings(captions, videos, self.caption_video, v2t=self.settings.v2t)
        ranks = [*scores.t2v_ranks.tolist(), *scores.v2t_ranks.tolist()]
        top = [*scores.t2v_top.tolist(), *scores.v2t_top.tolist()]
        raw = [{"rank": r, "retrieved_first": self.videos[t]} for r, t in zip(ranks, top)]
        return raw, [str(r) for r in ranks]

    def record(self, prepared) -> dict[str, Any]:
        s = self.settings
        with_captions = np.bincount(self.caption_video, minlength=len(self.videos))
        gallery = {
            "n_videos": len(self.videos), "n_captions": len(self.caption_ids),
            "captions_per_video_max": int(with_captions.max()) if len(with_captions) else 0,
            "n_from_features": sum(v.features is not None for v in self.gallery),
            "n_from_video_files": sum(v.features is None for v in self.gallery),
            "n_with_audio_file": sum(v.audio is not None for v in self.gallery),
            "n_with_transcript": sum(bool(v.transcript) for v in self.gallery),
            "limited": None if len(self.videos) == self.n_listed_videos else
            f"the first {len(self.videos)} of {self.n_listed_videos} videos (--limit): not comparable",
        }
        perturbation = None
        if self.task.perturbation is not None:
            seeds = {str(k): {"n_unchanged": v["n_unchanged"], "n_empty": v["n_empty"]}
                     for k, v in sorted(self.perturbations.items())}
            settings = next(iter(self.perturbations.values()))["settings"] if self.perturbations else None
            perturbation = {"kind": self.task.perturbation.kind, "seed": "the run's seed", "per_seed": seeds,
                            "settings": settings}
        return {"generation": None, "retrieval": {
            "settings": asdict(s), "folders": self.folders.record(), "off_settings": list(self.folders.off),
            "gallery": gallery, "n_queries": {"t2v": len(self.caption_ids), "v2t": len(self.videos)},
            "tie_rule": TIE_RULE, "tie_rule_description": TIE_RULE_DESCRIPTION,
            "v2t_convention": s.v2t, "v2t_convention_description": V2T_CONVENTIONS[s.v2t],
            "similarity": self.similarity, "perturbation": perturbation}}
