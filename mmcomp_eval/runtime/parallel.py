"""Data parallelism through the response store.

``accelerate launch -m mmcomp_eval ...``, ``torchrun -m mmcomp_eval ...``
and ``mmcomp-eval --num-processes N ...`` all start N copies of the same
command with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set. Every copy prepares
the same tasks and prompts (cheap and deterministic), answers its share of
the requests (every N-th distinct one, so long and short prompts spread evenly) into the
shared response store, and exits; process 0 then waits until the store holds
every answer and runs the ordinary single-process evaluation, which finds
everything in the store. Results are gathered in document order by
construction, scored once, and written once.

No collective operation is used, so there is no NCCL/gloo timeout to hit
when one process finishes long before another (as on a resumed run, where
one shard may be all cache hits), and a run started on 4 GPUs resumes on 1
or 3. All processes must share one machine (the store is a local SQLite
file); if one process fails, the launcher stops the others.

``results.json`` says what the user ran, not what a process was started
with: the launcher's own command line (``--num-processes`` passes it to its
processes; under ``accelerate launch``/``torchrun`` it is the launcher's
``/proc`` command line), the number of processes, and the response store's
hits and misses summed over the processes' shares. Helpers report their
counts as small files next to the store, filed under an id every process of
the run computes alike (the launcher's id, else a hash of the work).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mmcomp_eval.errors import UserError
from mmcomp_eval.runtime import atomic_files
from mmcomp_eval.runtime.output_lock import OutputLock

#: set by :func:`launch` for its processes: the launching command line (JSON list), recorded in results.json
COMMAND_ENV = "MMCOMP_COMMAND"
#: set by :func:`launch`: an id shared by the processes of one run, under which helpers report their counts
RUN_ID_ENV = "MMCOMP_RUN_ID"
#: set by torchrun, and so by ``accelerate launch``, whose workers are children of the launcher process
TORCHELASTIC_ENV = "TORCHELASTIC_RUN_ID"
#: how long process 0 waits, once every answer is stored, for the helpers' count reports
REPORT_WAIT_S = 60.0


@dataclass(frozen=True)
class ProcessInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def current() -> ProcessInfo:
    """This process's place, from the variables every launcher sets."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise UserError("RANK/WORLD_SIZE/LOCAL_RANK must be integers (set by accelerate launch or torchrun)") from None
    if world < 1 or not 0 <= rank < world:
        raise UserError(f"RANK={rank} WORLD_SIZE={world}: expected 0 <= RANK < WORLD_SIZE")
    return ProcessInfo(rank, world, local)


@dataclass(frozen=True)
class ShardCounts:
    """The response store's hits and misses of one process's share of the requests."""

    rank: int
    hits: int
    misses: int


def answer_shard(model, work: Sequence, info: ProcessInfo, poll_s: float = 0.5) -> list[ShardCounts] | None:
    """Answer this process's share of every model call; process 0 then waits for the rest.

    ``model`` is a :class:`~mmcomp_eval.runtime.caching_model.CachingModel`;
    ``work`` holds :class:`~mmcomp_eval.api.task.ModelCall` objects, whose
    per-request ``extra`` (``images``) is sliced like the requests.

    The share is cut by request *key*, not by row: every N-th distinct key,
    in order of first appearance over all calls, belongs to one process,
    which also takes that key's repeats. Cutting by row would send a repeated
    request (the same caption in two tasks, the same gallery video in every
    perturbed task of a dataset, identical captions of one dataset) to two
    processes that both miss the store and both encode it; cut by key, the
    processes' hits and misses add up to a single process's. Returns,
    in process 0, every process's counts for its share (a helper missing
    after :data:`REPORT_WAIT_S` is left out); None in helpers.
    """
    from mmcomp_eval.runtime.caching_model import CachingModel, _Subset

    if not isinstance(model, CachingModel):
        raise UserError("data-parallel runs pass answers through the response store; drop --no-cache")
    hits, misses = model.hits, model.misses
    all_keys: list[str] = []
    owner: dict[str, int] = {}  # request key -> the process that answers it
    for call in work:
        keys = model.keys(call.method, call.requests, call.extra.get("images"))
        for k in keys:
            owner.setdefault(k, len(owner) % info.world_size)
        rows = [i for i, k in enumerate(keys) if owner[k] == info.rank]
        mine = [call.requests[i] for i in rows]
        if mine:
            getattr(model, call.method)(mine, **{k: _Subset(v, rows) for k, v in call.extra.items()})
        all_keys += keys
    own = ShardCounts(info.rank, model.hits - hits, model.misses - misses)
    reports = _report_folder(model, all_keys, info)
    if not info.is_main:
        reports.mkdir(parents=True, exist_ok=True)
        atomic_files.write_text(reports / f"rank-{info.rank}.json", json.dumps(asdict(own)), durable=False)
        return None
    pending, last_note = all_keys, time.monotonic()
    while pending:
        pending = model.store.missing(model.model_key, pending)
        if pending and time.monotonic() - last_note > 30:
            print(f"mmcomp-eval: waiting for {len(pending)} answers from the other processes", file=sys.stderr)
            last_note = time.monotonic()
        if pending:
            time.sleep(poll_s)
    return [own, *_collect_reports(reports, info, poll_s)]


def _report_folder(model, keys: list[str], info: ProcessInfo) -> Path:
    """Where this run's helpers file their counts: an id every process of the run computes alike."""
    run_id = os.environ.get(RUN_ID_ENV) or hashlib.sha256(
        json.dumps([model.model_key, info.world_size, keys]).encode()).hexdigest()[:32]
    return model.store.directory / "shards" / run_id


def _collect_reports(folder: Path, info: ProcessInfo, poll_s: float) -> list[ShardCounts]:
    """The helpers' counts, written after their last answer; reports older than this process are stale."""
    started, deadline = process_start_time(), time.monotonic() + REPORT_WAIT_S
    found: dict[int, ShardCounts] = {}
    while len(found) < info.world_size - 1 and time.monotonic() < deadline:
        for rank in range(1, info.world_size):
            path = folder / f"rank-{rank}.json"
            try:
                if rank not in found and path.stat().st_mtime >= started - 1:
                    found[rank] = ShardCounts(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                pass  # not written yet
        if len(found) < info.world_size - 1:
            time.sleep(poll_s)
    shutil.rmtree(folder, ignore_errors=True)
    return [found[r] for r in sorted(found)]


def cache_record(report: dict[str, Any], shards: list[ShardCounts] | None) -> dict[str, Any]:
    """``results.json``'s ``cache``: in a data-parallel run, the counts of every process's share, summed.

    Process 0's own final pass, which finds every answer in the store, is
    not counted: it gathers, it does not look anything up for the first
    time. So the counts are those a single process would report.
    """
    if shards is None or not report.get("enabled"):
        return report
    return {**report, "hits": sum(s.hits for s in shards), "misses": sum(s.misses for s in shards),
            "processes": [asdict(s) for s in shards]}


def user_command() -> list[str]:
    """The command line the user typed to start this run (a process's own argv is not that in a launched run)."""
    given = os.environ.get(COMMAND_ENV)
    if given:
        return list(json.loads(given))
    if current().world_size > 1 and TORCHELASTIC_ENV in os.environ:
        try:  # the launcher (torchrun, accelerate launch) is every worker's parent
            parts = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
            return [p.decode(errors="replace") for p in parts if p]
        except OSError:
            pass
    return list(sys.argv)


def process_record(info: ProcessInfo) -> dict[str, Any]:
    """``results.json``'s ``processes``: how many answered, and what started them."""
    if info.world_size == 1:
        launcher = None
    elif COMMAND_ENV in os.environ:
        launcher = "mmcomp-eval"
    elif TORCHELASTIC_ENV in os.environ:
        launcher = "torchrun"
    else:
        launcher = "environment"
    return {"count": info.world_size, "launcher": launcher}


_IMPORTED = time.time()


def process_start_time() -> float:
    """When this process started (wall clock), from ``/proc``; this module's import time elsewhere."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _IMPORTED


class ProcessFailed(Exception):
    """A process of a data-parallel run failed; it has already said why on stderr."""

    def __init__(self, exit_code: int):
        super().__init__(f"a data-parallel process exited with code {exit_code} (its error is above)")
        self.exit_code = exit_code


def launch(command: Sequence[str], n: int, output_lock: OutputLock | None = None,
           env: Mapping[str, str] | None = None) -> None:
    """Run ``python command`` as ``n`` processes on this machine; raise :class:`ProcessFailed` if one fails.

    If any process fails, the others are stopped. ``output_lock``: the
    launcher's lock on the output folder, handed to process 0, the one that
    writes the results. ``env``: added to every process's environment, with
    this process's command line and a fresh run id.
    """
    if n < 1:
        raise UserError(f"--num-processes {n}: expected at least 1")
    shared = {**(env or {}), COMMAND_ENV: json.dumps(sys.argv), RUN_ID_ENV: uuid.uuid4().hex}
    cpus = os.cpu_count() or 1
    procs = []
    for rank in range(n):
        child_env = {**os.environ, **shared, "RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank),
                     "LOCAL_WORLD_SIZE": str(n)}
        child_env.setdefault("OMP_NUM_THREADS", str(max(1, cpus // n)))  # n processes must not each take every core
        fds: tuple[int, ...] = ()
        if rank == 0 and output_lock is not None:
            child_env.update(output_lock.child_env())
            fds = (output_lock.fd,)
        procs.append(subprocess.Popen([sys.executable, *command], env=child_env, pass_fds=fds))
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                _stop(procs)
                raise ProcessFailed(failed[0])
            if all(c == 0 for c in codes):
                return
            time.sleep(0.2)
    except KeyboardInterrupt:
        _stop(procs)
        raise


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
