"""``mmcomp_eval.evaluate``: one call from a model and task names to a results record.

The command line parses its flags and calls :func:`evaluate`; Python users
call it directly (like lm-evaluation-harness's ``simple_evaluate``). It owns
the order of a run, chosen so that every mistake a run can find without the
model costs seconds, not a model load:

1. options and task names are checked, and the model is resolved to its
   adapter and checked arguments without being built;
2. the output folder is locked and the response store opened;
3. every task is prepared (split, sampler, documents, prompts, media
   folders, choices) against the capabilities the adapter declares for
   those arguments, and every metric built with its resources (BERTScore's
   model found, the EK-100 category map loaded);
4. only then is the model built and wrapped by the response store; the
   keyframes of image prompts are decoded (a model that cannot load has
   not waited for that), and the model is asked.

``num_processes > 1`` starts that many copies of the same call
(:mod:`mmcomp_eval.evaluation.worker`) after doing steps 1-3 once here.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmcomp_eval.api.model import IN_MEMORY, Model, ModelCapabilities, ModelDefaults
from mmcomp_eval.config.model_args import accepted_arguments, parse_model_args
from mmcomp_eval.config.task_config import TaskConfig, parse_generation_overrides
from mmcomp_eval.errors import UserError
from mmcomp_eval.evaluation import evaluator
from mmcomp_eval.evaluation.prepare import ModelPlan, RunOptions
from mmcomp_eval.evaluation.results import ResultWriter
from mmcomp_eval.runtime import parallel
from mmcomp_eval.tasks.checks import check_task
from mmcomp_eval.tasks.index import TaskIndex
from mmcomp_eval.tasks.loaders import DataContext

log = logging.getLogger(__name__)

#: how a launcher passes :func:`evaluate`'s arguments (JSON) to its processes
SPEC_ENV = "MMCOMP_EVALUATE_SPEC"
#: where the launcher wants process 0 to leave the results record (JSON)
RESULTS_ENV = "MMCOMP_EVALUATE_RESULTS"


@dataclass(frozen=True)
class ModelTarget:
    """The model of a run, resolved and checked but not built: building is the run's last step."""

    name: str
    #: the arguments as given (``--model-args``, ``--batch-size`` and offline folded in): results.json's ``model.args``
    args: dict[str, Any]
    capabilities: ModelCapabilities
    #: the adapter's decoding defaults and prompt variant (applied per task where the task is silent)
    defaults: ModelDefaults = ModelDefaults()
    adapter: type[Model] | None = None
    kwargs: dict[str, Any] | None = None     # checked keyword arguments of ``adapter``, preset defaults merged
    instance: Model | None = None            # a model the caller built

    @classmethod
    def resolve(cls, model: str | Model, model_args: str | Mapping[str, Any] | None, batch_size: int | str | None,
                offline: bool, device: str | None = None) -> ModelTarget:
        if isinstance(model, Model):
            if model_args or batch_size is not None or device is not None:
                raise UserError("model_args, batch_size and device configure a model that evaluate() builds; "
                                "pass a model name, or build the model with them yourself")
            return cls(model.name, {}, model.capabilities, model.defaults, instance=model)
        from mmcomp_eval.models import MODELS

        if not isinstance(model, str) or not model:
            raise UserError(f"--model {model!r}: name an adapter or preset (see `mmcomp-eval ls models`) "
                            "or pass a Model object")
        args = parse_model_args(model_args) if model_args is None or isinstance(model_args, str) else dict(model_args)
        params = accepted_arguments(MODELS.get(MODELS.spec(model).adapter))
        if batch_size is not None:
            if "batch_size" not in params:
                raise UserError(f"--batch-size: model '{model}' takes no batch size")
            args["batch_size"] = batch_size
        if device is not None:
            if "device" not in params:
                raise UserError(f"--device: model '{model}' takes no device")
            args["device"] = device
        if offline and "offline" in params and "offline" not in args:
            args["offline"] = True
        adapter, kwargs = MODELS.resolve(model, args)
        return cls(model, args, adapter.capabilities_for(kwargs), adapter.defaults_for(kwargs), adapter, kwargs)

    def plan(self) -> ModelPlan:
        return ModelPlan(self.name, self.capabilities, self.defaults)

    def build(self) -> Model:
        """The model; refused if it turned out able to do other things than its adapter promised."""
        if self.instance is not None:
            return self.instance
        log.info("loading model %s (%s adapter)", self.name, self.adapter.name)
        built = self.adapter(**self.kwargs)
        if built.capabilities != self.capabilities:
            raise UserError(f"model '{self.name}': adapter {self.adapter.__name__} declared {self.capabilities} "
                            f"before loading but has {built.capabilities}; its capabilities_for must say what "
                            "its instances can do")
        return built


def evaluate(
    model: str | Model,
    tasks: str | Sequence[str | TaskConfig],
    *,
    model_args: str | Mapping[str, Any] | None = None,
    shots: int | None = None,
    seeds: Sequence[int] = (0,),
    limit: int | float | None = None,
    split: str | None = None,
    sampler: str | None = None,
    gen_kwargs: str | Mapping[str, Any] | None = None,
    apply_chat_template: bool = False,
    system_instruction: str | None = None,
    include_paths: Sequence[str | Path] = (),
    output_path: str | Path | None = None,
    batch_size: int | str | None = None,
    device: str | None = None,
    cache_dir: str | Path | None = None,
    no_cache: bool = False,
    num_processes: int = 1,
    offline: bool = False,
    ek100_dir: str | Path | None = None,
    progress: bool = True,
    predict_only: bool = False,
) -> dict[str, Any] | None:
    """Evaluate ``model`` on ``tasks``; the results record (what ``results.json`` holds).

    ``model``: an adapter or preset name (``model_args`` and ``batch_size``
    then configure it) or a :class:`~mmcomp_eval.api.model.Model` already
    built. ``tasks``: task and group names (a list, or one comma-separated
    string) or :class:`TaskConfig` objects. ``seeds``: the seeds to run
    (the CLI's ``--seed S --seeds N`` is ``range(S, S + N)``). ``limit``: a
    number of documents per task, or a fraction of them below 1 (lm-eval's
    rule). ``predict_only``: make and store the answers, build no metric;
    a later call without it scores the stored answers. The other
    arguments are the CLI's flags of the same names. Every input is checked
    before the model is built; a problem raises
    :class:`~mmcomp_eval.errors.UserError` with one line naming it.
    Returns None in the helper processes of a data-parallel run started by
    ``accelerate launch``/``torchrun`` (process 0 returns the record).
    """
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise UserError(f"--num-processes {num_processes}: expected at least 1")
    offline = bool(offline) or _env_offline()
    if offline:
        _go_offline()
    proc = parallel.current()
    if (num_processes > 1 or proc.world_size > 1) and no_cache:
        raise UserError("data-parallel runs pass answers through the response store; drop --no-cache")
    if num_processes > 1 and proc.world_size > 1:
        raise UserError("--num-processes inside accelerate launch/torchrun: let the launcher start the processes")
    opts = RunOptions(shots=shots, seeds=tuple(seeds), gen_kwargs=_gen_kwargs(gen_kwargs), limit=limit, split=split,
                      sampler=sampler, apply_chat_template=apply_chat_template,
                      system_instruction=system_instruction, predict_only=bool(predict_only),
                      include_paths=tuple(Path(p) for p in include_paths),
                      data=DataContext(ek100_dir=Path(ek100_dir) if ek100_dir else None, offline=offline),
                      progress=progress and proc.is_main and num_processes == 1)
    opts.validate()
    index = TaskIndex.build(opts.include_paths)
    task_configs = _resolve_tasks(tasks, index)
    target = ModelTarget.resolve(model, model_args, batch_size, offline, device)
    spec = _spec(model, target, task_configs, tasks, opts, output_path, cache_dir, progress) if num_processes > 1 else None
    # The output folder and the response store are claimed first: a second run on the same output path, a
    # read-only folder or a damaged store then costs seconds.
    with ResultWriter(Path(output_path) if output_path and proc.is_main else None) as writer:
        store = None if no_cache else _open_store(cache_dir, check=proc.is_main)
        try:
            run_plan = evaluator.plan(task_configs, target.plan(), opts, index)  # every check, no model yet
            if spec is not None:
                store.close()
                store = None
                return _launch(num_processes, writer, spec)
            built = target.build()
            info = {"name": target.name, "args": target.args, "fingerprint": built.fingerprint()}
            if store is not None and info["fingerprint"].get("pretrained") == IN_MEMORY:
                log.warning("model %s was handed over in memory without a name: its answers are not stored "
                            "(give from_loaded a pretrained= name that identifies the weights to store them)",
                            target.name)
                store.close()
                store = None
            if store is not None:
                from mmcomp_eval.runtime.caching_model import CachingModel, cache_identity

                built = CachingModel(built, store, cache_identity(built, target.args))
            record = evaluator.execute(run_plan, built, info, writer)
        finally:
            if store is not None:
                store.close()
    # JSON types (lists, not tuples), as results.json and a data-parallel run's process 0 hand it back
    return json.loads(json.dumps(record.as_dict(), ensure_ascii=False, default=str)) if record is not None else None


def _env_offline() -> bool:
    from mmcomp_eval.paths import is_offline

    return is_offline()


def _go_offline() -> None:
    """Make every library that could download something refuse to."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "MMCOMP_OFFLINE"):
        os.environ[var] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # read at import time: set it on the module too
        constants.HF_HUB_OFFLINE = True


def _gen_kwargs(given: str | Mapping[str, Any] | None) -> dict[str, Any]:
    pairs = parse_model_args(given, flag="--gen-kwargs") if given is None or isinstance(given, str) else dict(given)
    return parse_generation_overrides(pairs)


def _resolve_tasks(tasks: str | Sequence[str | TaskConfig], index: TaskIndex) -> list[TaskConfig]:
    items = [n.strip() for n in tasks.split(",")] if isinstance(tasks, str) else list(tasks)
    out: dict[str, TaskConfig] = {}
    for item in items:
        if isinstance(item, TaskConfig):
            out.setdefault(item.task, check_task(item))
        elif isinstance(item, str) and item:
            for cfg in index.resolve([item]):
                out.setdefault(cfg.task, cfg)
        elif not isinstance(item, str):
            raise UserError(f"tasks: {item!r} is neither a task name nor a TaskConfig")
    if not out:
        raise UserError("--tasks is empty; see `mmcomp-eval ls tasks`")
    return list(out.values())


def _open_store(directory: str | Path | None, check: bool):
    from mmcomp_eval.paths import cache_dir
    from mmcomp_eval.runtime.response_store import ResponseStore

    return ResponseStore(Path(directory) if directory else cache_dir() / "responses", check=check)


def _spec(model, target: ModelTarget, task_configs: list[TaskConfig], tasks, opts: RunOptions, output_path,
          cache_dir, progress: bool) -> dict[str, Any]:
    """:func:`evaluate`'s arguments for the processes of a data-parallel run, as JSON values."""
    if target.instance is not None:
        raise UserError("num_processes > 1 starts new processes, which cannot share a Model object; "
                        "pass the model's name (and model_args)")
    if not isinstance(tasks, str) and any(isinstance(t, TaskConfig) for t in tasks):
        raise UserError("num_processes > 1 starts new processes, which find tasks by name; pass task names "
                        "(with include_paths for your own task files)")
    return {"model": model, "model_args": target.args, "tasks": [t.task for t in task_configs],
            "shots": opts.shots, "seeds": list(opts.seeds), "limit": opts.limit, "split": opts.split,
            "sampler": opts.sampler, "gen_kwargs": opts.gen_kwargs, "apply_chat_template": opts.apply_chat_template,
            "system_instruction": opts.system_instruction, "predict_only": opts.predict_only,
            "include_paths": [str(p) for p in opts.include_paths],
            "output_path": str(output_path) if output_path else None,
            "cache_dir": str(cache_dir) if cache_dir else None, "offline": opts.data.offline,
            "ek100_dir": str(opts.data.ek100_dir) if opts.data.ek100_dir else None, "progress": progress}


def _launch(n: int, writer: ResultWriter, spec: dict[str, Any]) -> dict[str, Any] | None:
    """Run the checked call as ``n`` processes; process 0's results record.

    The output lock is handed to process 0, the one that writes the results.
    """
    with tempfile.TemporaryDirectory(prefix="mmcomp-eval-") as tmp:
        results = Path(tmp) / "results.json"
        parallel.launch(["-m", "mmcomp_eval.evaluation.worker"], n, writer.lock,
                        {SPEC_ENV: json.dumps(spec, default=str), RESULTS_ENV: str(results)})
        return json.loads(results.read_text()) if results.is_file() else None
