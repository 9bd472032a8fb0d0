"""Fault cases in one go: what a killed, interrupted, raced, disk-starved or damaged-store run leaves behind.

    python bench/bench_faults.py [--docs 80] [--work /tmp/mmcomp_bench_faults]
    python bench/bench_faults.py --check-cost [--responses 100000]

Model and task as in ``bench_resume.py`` (a 2-layer random Llama with
SmolLM2's tokenizer, greedy, a word-echo task, one request per document).
Every case starts from an output folder that holds a previous complete run
(the same command with ``--limit docs/4``) and, unless said otherwise, an
empty response store; the case's run then meets its fault. Columns:

* ``exit``: the faulted run's exit code (negative: killed by that signal);
* ``message``: its one-line error (start), or ``-``;
* ``stored``: answers in the store when the faulted run had exited;
* ``lost``: of those, how many the rerun (same command, fault removed) had
  to ask the model again; the target is 0;
* ``previous pair``: whether results.json and samples.jsonl are still the
  previous run's, byte for byte (``replaced whole`` where the case's own run
  completed, checked against samples_sha256);
* ``rerun``: the rerun's exit code and whether its samples.jsonl equals an
  uninterrupted run's, byte for byte.

A full disk is a small tmpfs where this process may mount one (root);
elsewhere it is simulated with RLIMIT_FSIZE (writes fail with EFBIG, "File
too large", which SQLite reports as an I/O error, not "disk full"); the
table says which. The truncated EK-100 case runs ``data build compact`` on a
copy of $MMCOMP_DATA_DIR/ek100 whose train file ends inside a number; it
needs that data and shows what happens today (checking the CSV is another
change's work).

``--check-cost`` measures ``PRAGMA quick_check`` on stores of N generated
answers and N log-likelihood lists (97 choices), with the file in the page
cache ("hot") and evicted from it ("cold", posix_fadvise DONTNEED), and the
cost of opening the store when the check is skipped (file unchanged since a
checked close).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_resume import REPO, tiny_llama, write_task  # noqa: E402

sys.path.insert(0, str(REPO))


#: the --work folder, left out of the messages in the table
_WORK = [""]


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9-]+", "_", name).strip("_")


@dataclass
class Setup:
    work: Path
    model: Path
    tasks: Path
    docs: int
    env: dict
    previous: Path     # a folder whose out/ holds the previous complete pair
    reference: Path    # an uninterrupted run of the full command
    disk: str          # "tmpfs" or "RLIMIT_FSIZE"


def command(s: Setup, store: Path, out: Path, limit: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "mmcomp_eval", "--model", "hf", "--model-args",
           f"pretrained={s.model},batch_size=4", "--tasks", "bench_echo", "--include-path", str(s.tasks),
           "--no-progress", "--cache-dir", str(store), "--output-path", str(out)]
    return cmd + (["--limit", str(limit)] if limit else [])


def start(s: Setup, cmd: list[str], fsize: int | None = None) -> subprocess.Popen:
    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.Popen(cmd, env=s.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=limit_file_size if fsize else None)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate()
    lines = [ln for ln in err.splitlines() if ln.startswith("mmcomp-eval:")]
    if lines:
        return proc.returncode, lines[-1].removeprefix("mmcomp-eval: error: ")
    if "Traceback" in err:
        return proc.returncode, "TRACEBACK: " + err.strip().splitlines()[-1]
    return proc.returncode, "-"


def _count(store: Path) -> int:
    db = store / "responses.sqlite"
    if not db.is_file():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
            return con.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
    except sqlite3.OperationalError:  # the run is creating the tables
        return 0


def pair(out: Path) -> tuple[bytes, bytes] | None:
    try:
        return (out / "results.json").read_bytes(), (out / "samples.jsonl").read_bytes()
    except FileNotFoundError:
        return None


def pair_state(out: Path, previous: tuple[bytes, bytes]) -> str:
    now = pair(out)
    if now is None:
        return "MISSING"
    if now == previous:
        return "intact"
    if (now[0] == previous[0]) != (now[1] == previous[1]):
        return f"BROKEN: only {'samples.jsonl' if now[0] == previous[0] else 'results.json'} replaced"
    recorded = json.loads(now[0]).get("samples_sha256")
    if recorded is None:  # written before samples_sha256 existed: only a byte comparison can tell
        return "replaced, no samples_sha256 to check"
    return "replaced whole" if recorded == hashlib.sha256(now[1]).hexdigest() else "BROKEN (split pair)"


def seed_case(s: Setup, name: str, store_from: Path | None = None) -> tuple[Path, Path, Path]:
    """A case folder: out/ with the previous complete pair, and a store (empty, or a copy)."""
    folder = s.work / slug(name)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    shutil.copytree(s.previous / "out", folder / "out")
    store = folder / "store"
    if store_from is not None:
        shutil.copytree(store_from, store)
    return folder, folder / "out", store


def rerun(s: Setup, store: Path, out: Path) -> tuple[int, int, str]:
    """(exit code, answers found in the store, samples identical to the reference?)."""
    code, msg = finish(start(s, command(s, store, out)))
    if code != 0:
        return code, 0, f"failed: {msg[:60]}"
    hits = json.loads((out / "results.json").read_text())["cache"]["hits"]
    same = (out / "samples.jsonl").read_bytes() == (s.reference / "out" / "samples.jsonl").read_bytes()
    return code, hits, "identical" if same else "DIFFERS"


def row(case: str, code: int, msg: str, stored_n, lost, pair_s: str, rerun_s: str) -> dict:
    msg = msg.replace(f"{_WORK[0]}/", "")  # paths relative to --work
    return {"case": case, "exit": code, "message": msg if len(msg) <= 140 else msg[:137] + "...",
            "stored": stored_n, "lost": lost, "previous pair": pair_s, "rerun": rerun_s}


def signal_case(s: Setup, name: str, sig: signal.Signals) -> dict:
    folder, out, store = seed_case(s, name)
    previous = pair(out)
    proc = start(s, command(s, store, out))
    while proc.poll() is None and _count(store) < s.docs // 2:
        time.sleep(0.05)
    os.killpg(proc.pid, sig)
    code, msg = finish(proc)
    n = _count(store)
    state = pair_state(out, previous)
    rc, hits, same = rerun(s, store, out)
    return row(name, code, msg, n, n - hits, state, f"{rc}, {same}")


def concurrent_case(s: Setup, name: str, stagger: bool) -> dict:
    """Two runs of one command on one folder: together, or the second when the first is half way."""
    folder, out, store = seed_case(s, name)
    previous = pair(out)
    first = start(s, command(s, store, out))
    if stagger:
        while first.poll() is None and _count(store) < s.docs // 2:
            time.sleep(0.05)
    second = start(s, command(s, store, out))
    results = [finish(first), finish(second)]
    codes = sorted(c for c, _ in results)
    msg = next((m for c, m in results if c != 0), "-")
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    keys = [(r["task"], r["seed"], r["doc_id"]) for r in rows]
    state = pair_state(out, previous) + (f", {len(keys)} rows, {len(keys) - len(set(keys))} duplicated")
    same = (out / "samples.jsonl").read_bytes() == (s.reference / "out" / "samples.jsonl").read_bytes()
    return row(name, "/".join(map(str, codes)), msg, _count(store), 0, state,
               "- (winner " + ("identical" if same else "DIFFERS") + ")")


def mount_small(path: Path, size_kb: int) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def fill(disk: Path, leave: int) -> Path:
    st = os.statvfs(disk)
    filler = disk / "filler"
    filler.write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return filler


def full_disk_case(s: Setup, name: str, what: str) -> dict:
    """The disk under the store (``what="store"``) or under the output folder fills up mid-run."""
    folder, out, store = seed_case(s, name)
    previous = pair(out)
    if s.disk == "tmpfs":
        disk = folder / "disk"
        mount_small(disk, 8192)
        try:
            if what == "store":
                store = disk / "store"
                filler = fill(disk, 256 * 1024)  # the store's first pages and some answers' WAL commits
            else:
                shutil.move(str(out), str(disk / "out"))
                out = disk / "out"
                filler = fill(disk, 12 * 1024)  # a lock file and a few samples
            code, msg = finish(start(s, command(s, store, out)))
            n = _count(store)
            state = pair_state(out, previous)
            filler.unlink()
            rc, hits, same = rerun(s, store, out)
        finally:
            shutil.rmtree(disk / "store", ignore_errors=True)
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    else:
        if what != "store":
            return row(name, "-", "needs a tmpfs: a file size limit hits the store first", "-", "-", "-", "-")
        code, msg = finish(start(s, command(s, store, out), fsize=256 * 1024))
        n = _count(store)
        state = pair_state(out, previous)
        rc, hits, same = rerun(s, store, out)
    return row(f"{name} ({s.disk})", code, msg, n, n - hits, state, f"{rc}, {same}")


def damaged_store_case(s: Setup, name: str) -> dict:
    folder, out, store = seed_case(s, name, store_from=s.reference / "store")
    previous = pair(out)
    db = store / "responses.sqlite"
    total = _count(store)
    with open(db, "r+b") as f:  # overwrite the last page (a leaf of answers), as a bad sector would
        f.seek(os.path.getsize(db) - 4096)
        f.write(bytes(range(256)) * 16)
    damaged = db.read_bytes()
    code, msg = finish(start(s, command(s, store, out)))
    untouched = db.read_bytes() == damaged
    state = pair_state(out, previous)
    if shutil.which("sqlite3") is None:
        return row(name, code, msg, total, "0 by the run" if untouched else "STORE CHANGED", state, "no sqlite3 CLI")
    shutil.move(str(db), str(db) + ".damaged")  # what the message says, then the salvage from docs/results.md
    for extra in ("-wal", "-shm", ".checked"):
        Path(str(db) + extra).unlink(missing_ok=True)
    subprocess.run(f"sqlite3 '{db}.damaged' .dump | sed 's/^ROLLBACK; -- due to errors$/COMMIT;/' "
                   f"| sqlite3 '{db}'", shell=True, check=True, capture_output=True)
    salvaged = _count(store)
    rc, hits, same = rerun(s, store, out)
    lost = f"0 by the run; {total - salvaged} on the damaged page"
    return row(name, code, msg, total, lost, state, f"{rc}, {same}, salvage kept {salvaged}/{total}")


def read_only_output_case(s: Setup, name: str) -> dict:
    folder, out, store = seed_case(s, name)
    previous = pair(out)
    if os.geteuid() == 0:
        if subprocess.run(["mount", "-o", "bind,ro", str(out), str(out)], capture_output=True).returncode:
            return row(name, "-", "cannot make a read-only folder here", "-", "-", "-", "-")
    else:
        out.chmod(0o555)
    started = time.perf_counter()
    code, msg = finish(start(s, command(s, store, out)))
    seconds = time.perf_counter() - started
    if os.geteuid() == 0:
        subprocess.run(["umount", str(out)], capture_output=True)
    else:
        out.chmod(0o755)
    return row(name, code, msg, _count(store), 0, pair_state(out, previous), f"- (refused after {seconds:.1f} s)")


def truncated_csv_case(s: Setup, name: str) -> dict:
    data = os.environ.get("MMCOMP_DATA_DIR")
    if not data or not (Path(data) / "ek100").is_dir():
        return row(name, "-", "needs MMCOMP_DATA_DIR with ek100/", "-", "-", "-", "-")
    folder = s.work / slug(name)
    shutil.rmtree(folder, ignore_errors=True)
    kept = {}
    for variant in ("intact", "truncated"):
        ek = folder / variant
        shutil.copytree(Path(data) / "ek100", ek)
        for f in ek.iterdir():
            f.chmod(0o644)
        if variant == "truncated":  # the last line ends inside its noun class: ...,cooker,46 becomes ...,cooker,4
            csv_file = ek / "EPIC_100_validation.csv"
            text = csv_file.read_bytes().rstrip(b"\n")
            head, last = text.rsplit(b"\n", 1)
            fields = last.split(b",")
            cut = max(i for i, f in enumerate(fields) if f.isdigit() and len(f) > 1)
            csv_file.write_bytes(head + b"\n" + b",".join(fields[:cut]) + b"," + fields[cut][:1] + b"\n")
        # the intact build uses the bench's shared cache (a hit on later runs); the truncated one a fresh cache
        env = s.env if variant == "intact" else {**s.env, "MMCOMP_CACHE_DIR": str(folder / "cache")}
        proc = subprocess.run([sys.executable, "-m", "mmcomp_eval", "data", "build", "compact", "--ek100-dir", str(ek),
                               "--offline"], env=env, capture_output=True, text=True)
        found = re.search(r"windows considered (\d+), kept (\d+)", proc.stdout)
        kept[variant] = (proc.returncode, found.group(2) if found else "?",
                         proc.stderr.strip().splitlines()[-1] if proc.returncode and proc.stderr.strip() else "-")
    code, windows, msg = kept["truncated"]
    return row(name, code, msg, "-", "-", "-", f"- (windows kept: {kept['intact'][1]} intact, {windows} truncated)")


def check_cost(n: int, work: Path) -> None:
    from mmcomp_eval.runtime.response_store import ResponseStore

    print("| store | responses | size MB | quick_check hot s | quick_check cold s | open, check skipped s |")
    print("|---|---|---|---|---|---|")
    rnd = random.Random(0)
    for kind in ("generate", "loglikelihood"):
        folder = work / f"check-{kind}"
        shutil.rmtree(folder, ignore_errors=True)
        store = ResponseStore(folder)
        store._db.execute("BEGIN")
        for i in range(n):
            value = (" ".join(rnd.choice(("take", "knife", "put", "plate")) for _ in range(6)) if kind == "generate"
                     else [rnd.random() * -10 for _ in range(97)])
            store._db.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?)",
                              ("m" * 64, f"{i:064x}", kind, json.dumps(value), 0.0))
        store._db.execute("COMMIT")
        store.close()
        db = folder / "responses.sqlite"
        times = {}
        for state in ("cold", "hot"):
            if state == "cold":
                fd = os.open(db, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            con = sqlite3.connect(db)
            t = time.perf_counter()
            con.execute("PRAGMA quick_check").fetchall()
            times[state] = time.perf_counter() - t
            con.close()
        ResponseStore(folder).close()  # a checked close: the next open skips the check
        t = time.perf_counter()
        ResponseStore(folder).close()
        skipped = time.perf_counter() - t
        print(f"| {kind} | {n} | {db.stat().st_size / 1e6:.1f} | {times['hot']:.2f} | {times['cold']:.2f} | "
              f"{skipped:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=80)
    ap.add_argument("--work", type=Path, default=Path("/tmp/mmcomp_bench_faults"))
    ap.add_argument("--check-cost", action="store_true")
    ap.add_argument("--responses", type=int, default=100_000)
    args = ap.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    _WORK[0] = str(work)
    if args.check_cost:
        check_cost(args.responses, work)
        return
    env = {**os.environ, "MMCOMP_CACHE_DIR": str(work / "cache"), "PYTHONPATH": str(REPO)}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    os.environ["MMCOMP_CACHE_DIR"] = env["MMCOMP_CACHE_DIR"]
    probe = work / "probe"
    disk = "tmpfs" if mount_small(probe, 64) else "RLIMIT_FSIZE"
    subprocess.run(["umount", str(probe)], capture_output=True)
    s = Setup(work, tiny_llama(work), write_task(work, args.docs), args.docs, env, work / "previous",
              work / "reference", disk)
    started = time.perf_counter()
    for folder, limit in ((s.previous, args.docs // 4), (s.reference, None)):
        shutil.rmtree(folder, ignore_errors=True)
        code, msg = finish(start(s, command(s, folder / "store", folder / "out", limit)))
        if code != 0:
            sys.exit(f"setup run failed: {msg}")
    t_ref = time.perf_counter() - started
    rows = [
        signal_case(s, "SIGKILL half way", signal.SIGKILL),
        signal_case(s, "SIGINT half way", signal.SIGINT),
        signal_case(s, "SIGTERM half way", signal.SIGTERM),
        concurrent_case(s, "2 runs, 1 folder, together", stagger=False),
        concurrent_case(s, "2 runs, 1 folder, 2nd half way", stagger=True),
        full_disk_case(s, "full disk under the store", "store"),
        full_disk_case(s, "full disk under the output", "output"),
        damaged_store_case(s, "damaged store"),
        read_only_output_case(s, "read-only output folder"),
        truncated_csv_case(s, "truncated EK-100 validation CSV"),
    ]
    print(f"{args.docs} requests per run; setup (2 runs) {t_ref:.1f} s; total {time.perf_counter() - started:.0f} s\n")
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]).replace("|", "/") for k in keys) + " |")


if __name__ == "__main__":
    main()
