"""What the one-GPU cluster benchmarks share (collective_time.py, interference.py,
overlap.py, enqueue.py): timing in trials with their median and spread, the
results' header, and writing a benchmark's result as one part of a JSON file
that several of them fill (bench/gpu_session's cluster-1gpu.json).

Every result says what in it is measured and what is modeled: a "labels"
map in its header, field -> "measured" | "modeled" | "counted" (bytes and
launches counted from the plan, not observed).
"""
from __future__ import annotations

import datetime
import os
import re
import statistics
import sys
import time

import torch

from fp8comm.bench import device_label
from json_parts import write_part, write_whole  # noqa: F401  (the benches write through one_gpu)

CODEC_VARIABLE = "FP8COMM_CUDA_CODEC"  # the CUDA codec kernel set a process runs


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "KMG" else s) * mult)


def pick_device(name: str) -> str:
    """cuda where asked and there (fp8comm built with CUDA), else an error; cpu: the smoke mode."""
    if name == "cuda":
        import fp8comm

        if not (torch.cuda.is_available() and fp8comm._C.has_cuda):
            raise SystemExit("error: --device cuda needs a GPU and fp8comm built with CUDA; --smoke runs on the CPU")
    return name


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_trials(fn, device: str, trials: int, reps: int, warmup: int = 2) -> dict:
    """Seconds per call of fn: `trials` timings of `reps` calls each, after
    `warmup` calls; CUDA events on the current stream on a GPU, wall time on the
    CPU. The median, the spread (max / min - 1) and every trial."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    seconds = []
    for _ in range(trials):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1e3 / reps)
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            seconds.append((time.perf_counter() - t0) / reps)
    return summarize(seconds)


def summarize(seconds: list[float]) -> dict:
    return {"median_s": statistics.median(seconds), "min_s": min(seconds), "max_s": max(seconds),
            "spread": max(seconds) / min(seconds) - 1 if min(seconds) > 0 else None, "trials_s": seconds}


def copy_bytes_per_s(device: str, numel: int = 1 << 26, trials: int = 5) -> float:
    """A device-to-device FP32 copy's rate, bytes read + written per second: the ceiling the codec is held to."""
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    t = time_trials(lambda: dst.copy_(src), device, trials, 5 if device == "cuda" else 1)
    return 8 * numel / t["median_s"]


def notes_of(doc: str) -> str:
    """The paragraphs of a benchmark's docstring that say what is measured and what modeled."""
    return "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n") if re.search(r"[Mm]easured|MODELED", p))


def header(benchmark: str, device: str, smoke: bool, labels: dict, notes: str) -> dict:
    return {
        "benchmark": benchmark,
        "date": datetime.date.today().isoformat(),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "device": device_label(device == "cuda"),
        "torch": torch.__version__,
        CODEC_VARIABLE: os.environ.get(CODEC_VARIABLE),
        "smoke": smoke,
        "labels": labels,
        "notes": notes,
    }


