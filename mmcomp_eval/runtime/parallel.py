"""Data parallelism through the response store.

``accelerate launch -m mmcomp_eval ...``, ``torchrun -m mmcomp_eval ...``
and ``mmcomp-eval --num-processes N ...`` all start N copies of the same
command with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set. Every copy prepares
the same tasks and prompts (cheap and deterministic), answers its share of
the documents (every N-th, so long and short prompts spread evenly) into the
shared response store, and exits; process 0 then waits until the store holds
every answer and runs the ordinary single-process evaluation, which finds
everything in the store. Results are gathered in document order by
construction, scored once, and written once.

No collective operation is used, so there is no NCCL/gloo timeout to hit
when one process finishes long before another (as on a resumed run, where
one shard may be all cache hits), and a run started on 4 GPUs resumes on 1
or 3. All processes must share one machine (the store is a local SQLite
file); if one process fails, the launcher stops the others.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from mmcomp_eval.errors import UserError
from mmcomp_eval.runtime.output_lock import OutputLock


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


def answer_shard(model, work: Sequence[tuple[str, list, dict]], info: ProcessInfo, poll_s: float = 0.5) -> None:
    """Answer this process's share of every request list; process 0 then waits for the rest.

    ``model`` is a :class:`~mmcomp_eval.runtime.caching_model.CachingModel`; ``work``
    holds ``(kind, requests, extra)`` as from ``evaluator.requests_for``: kind
    is ``generate`` or ``loglikelihood``, ``extra`` holds per-request
    arguments (``images``) that are sliced like the requests.
    """
    from mmcomp_eval.runtime.caching_model import CachingModel, _Subset

    if not isinstance(model, CachingModel):
        raise UserError("data-parallel runs pass answers through the response store; drop --no-cache")
    pending: list[str] = []
    for kind, requests, extra in work:
        rows = range(info.rank, len(requests), info.world_size)
        mine = [requests[i] for i in rows]
        if mine:
            call = model.generate if kind == "generate" else model.loglikelihood
            call(mine, **{k: _Subset(v, rows) for k, v in extra.items()})
        if info.is_main:
            pending += model.keys(kind, requests, extra.get("images"))
    if not info.is_main:
        return
    last_note = time.monotonic()
    while True:
        pending = model.store.missing(model.model_key, pending)
        if not pending:
            return
        if time.monotonic() - last_note > 30:
            print(f"mmcomp-eval: waiting for {len(pending)} answers from the other processes", file=sys.stderr)
            last_note = time.monotonic()
        time.sleep(poll_s)


def launch(argv: Sequence[str], n: int, output_lock: OutputLock | None = None) -> int:
    """Run ``mmcomp-eval argv`` as ``n`` processes on this machine; rank 0's exit code.

    If any process fails, the others are stopped and its exit code returned.
    ``output_lock``: the launcher's lock on ``--output-path``, handed to
    process 0, the one that writes the results.
    """
    if n < 1:
        raise UserError(f"--num-processes {n}: expected at least 1")
    cpus = os.cpu_count() or 1
    procs = []
    for rank in range(n):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(n)}
        env.setdefault("OMP_NUM_THREADS", str(max(1, cpus // n)))  # n processes must not each take every core
        fds: tuple[int, ...] = ()
        if rank == 0 and output_lock is not None:
            env.update(output_lock.child_env())
            fds = (output_lock.fd,)
        procs.append(subprocess.Popen([sys.executable, "-m", "mmcomp_eval", *argv], env=env, pass_fds=fds))
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                _stop(procs)
                return failed[0]
            if all(c == 0 for c in codes):
                return 0
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
