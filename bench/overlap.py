"""Overlap: the chunked codec of an all_reduce against a throttled device copy
standing in for the wire (issue 44, 4d). How much of the codec hides behind
the wire is what the cluster model needs to know, and one GPU can show it.

    python bench/overlap.py [--link-gbyte-per-s 50,450] [--json PATH [--part KEY]]
    python bench/overlap.py --smoke     # the CPU: the schedule run in order, no streams, no throttle

The schedule is all_reduce.cpp's on rank RANK of P = 8 (collective_time.py's
launches): every chunk's quantize on the compute stream, each chunk's
exchange on a wire stream as its quantize ends; each chunk's sum +
re-quantize once its exchange arrived, then its all-gather on the wire; the
decodes once the last all-gather arrived. A "wire transfer" is a real
device copy of the bytes that phase sends, then a spin (torch.cuda._sleep,
one thread, no memory traffic) padding it to bytes / link rate: the wire is
MODELED at the link rate given, the codec and the copy are MEASURED.

Rows: the pipelined time (two streams), the serial time (the same work on one
stream), the codec's and the wire's time each alone, and the overlap: the
share of the smaller of the two that the pipeline hid,
(serial - pipelined) / min(codec, wire).
"""
from __future__ import annotations

import argparse

import torch

import collective_time
import fp8comm
import one_gpu

RANKS = 8
NUMEL = 1 << 27  # 128M elements: 8 chunks of NCCL's 16M


def spin_cycles_per_s() -> float:
    """torch.cuda._sleep's cycles per second (the SM clock as the spin sees it)."""
    cycles = 10_000_000
    t = one_gpu.time_trials(lambda: torch.cuda._sleep(cycles), "cuda", 3, 1)
    return cycles / t["median_s"]


class Schedule:
    def __init__(self, wire_format: str, dtype: torch.dtype, numel: int, chunk_numel: int, device: str,
                 link_bytes_per_s: float | None, cycles_per_s: float | None):
        self.fmt = {"wire_format": wire_format}
        self.device = device
        block = fp8comm.codec.default_block_size(wire_format)
        self.plan = collective_time.launches("all_reduce", RANKS, block, numel, chunk_numel)
        self.chunks = collective_time.chunk_plan(RANKS, block, True, numel, chunk_numel)
        self.bufs = collective_time.Buffers(self.plan, dtype, device, self.fmt)
        n = len(self.chunks)
        per_chunk = len(self.plan) // n - 2  # quantize launches per chunk
        self.quantizes = [self.plan[i * per_chunk:(i + 1) * per_chunk] for i in range(n)]
        self.sums = self.plan[n * per_chunk:n * per_chunk + n]
        self.decodes = self.plan[n * per_chunk + n:]
        S = [fp8comm.segment_bytes(c.m, **self.fmt) for c in self.chunks]
        self.exchange_bytes = [(RANKS - 1) * s for s in S]  # sent = received, one direction counted
        self.gather_bytes = [(RANKS - 1) * s for s in S]
        most = max(self.exchange_bytes)
        self.src = torch.empty(most, dtype=torch.uint8, device=device)
        self.dst = torch.empty(most, dtype=torch.uint8, device=device)
        self.link = link_bytes_per_s
        self.cycles_per_s = cycles_per_s
        self.pad: dict = {}

    def calibrate(self) -> None:
        """Each transfer's spin: bytes / link rate less its copy's own time."""
        if self.link is None:
            return
        for nbytes in set(self.exchange_bytes + self.gather_bytes):
            copy = one_gpu.time_trials(lambda: self.dst[:nbytes].copy_(self.src[:nbytes]), "cuda", 3, 5)["median_s"]
            self.pad[nbytes] = int(max(0.0, nbytes / self.link - copy) * self.cycles_per_s)

    def transfer(self, nbytes: int) -> None:
        self.dst[:nbytes].copy_(self.src[:nbytes])
        if self.pad.get(nbytes):
            torch.cuda._sleep(self.pad[nbytes])

    def codec_only(self) -> None:
        for x in self.plan:
            self.bufs.run(x)

    def wire_only(self) -> None:
        for b in self.exchange_bytes + self.gather_bytes:
            self.transfer(b)

    def serial(self) -> None:
        for i, q in enumerate(self.quantizes):
            for x in q:
                self.bufs.run(x)
            self.transfer(self.exchange_bytes[i])
        for i, s in enumerate(self.sums):
            self.bufs.run(s)
            self.transfer(self.gather_bytes[i])
        for x in self.decodes:
            self.bufs.run(x)

    def _send(self, nbytes: int):
        """The wire stream sends `nbytes` once the compute stream's work so far
        is done; returns the event of the send's end."""
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream())
        self.wire_stream.wait_event(ev)
        with torch.cuda.stream(self.wire_stream):
            self.transfer(nbytes)
            done = torch.cuda.Event()
            done.record(self.wire_stream)
        return done

    def pipelined(self) -> None:
        compute = torch.cuda.current_stream()
        sent, gathered = [], []
        for i, q in enumerate(self.quantizes):
            for x in q:
                self.bufs.run(x)
            sent.append(self._send(self.exchange_bytes[i]))
        for i, s in enumerate(self.sums):
            compute.wait_event(sent[i])
            self.bufs.run(s)
            gathered.append(self._send(self.gather_bytes[i]))
        compute.wait_event(gathered[-1])
        for x in self.decodes:
            self.bufs.run(x)


def measure(wire_format: str, dtype_name: str, link_gbyte_per_s: float | None, numel: int, chunk_numel: int,
            device: str, trials: int, cycles_per_s: float | None) -> dict:
    link = link_gbyte_per_s * 1e9 if link_gbyte_per_s else None
    s = Schedule(wire_format, getattr(torch, dtype_name), numel, chunk_numel, device, link, cycles_per_s)
    row = {"wire_format": wire_format, "dtype": dtype_name, "ranks": RANKS, "numel": numel, "chunks": len(s.chunks),
           "link_gbyte_per_s": link_gbyte_per_s, "wire_bytes": sum(s.exchange_bytes + s.gather_bytes)}
    if device != "cuda":
        row["serial_s"] = one_gpu.time_trials(s.serial, device, trials, 1)["median_s"]
        row.update(pipelined_s=None, codec_s=None, wire_s=None, overlap=None,
                   why_none="no streams on the CPU: the smoke mode runs the schedule in order")
        return row
    s.wire_stream = torch.cuda.Stream()
    s.calibrate()
    codec = one_gpu.time_trials(s.codec_only, device, trials, 1)
    wire = one_gpu.time_trials(s.wire_only, device, trials, 1)
    serial = one_gpu.time_trials(s.serial, device, trials, 1)
    piped = one_gpu.time_trials(s.pipelined, device, trials, 1)
    hideable = min(codec["median_s"], wire["median_s"])
    row.update(codec_s=codec["median_s"], wire_s=wire["median_s"], serial_s=serial["median_s"],
               pipelined_s=piped["median_s"], pipelined_spread=piped["spread"],
               overlap=(serial["median_s"] - piped["median_s"]) / hideable if hideable > 0 else None,
               bound_s=max(codec["median_s"], wire["median_s"]))
    return row


LABELS = {"codec_s": "measured", "serial_s": "measured (the modeled wire included)",
          "pipelined_s": "measured (the modeled wire included)",
          "wire_s": "MODELED: a measured device copy padded by a spin to bytes / link_gbyte_per_s",
          "overlap": "(serial - pipelined) / min(codec, wire), from the above", "wire_bytes": "counted",
          "bound_s": "max(codec, wire): a perfect pipeline's time"}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--wire-formats", default="e4m3,mxfp4")
    p.add_argument("--dtypes", default="bfloat16")
    p.add_argument("--link-gbyte-per-s", default="50,450",
                   help="modeled links, GB/s one way: 50 an InfiniBand NDR port, 450 an H100's NVLink")
    p.add_argument("--numel", default="128M")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="the CPU, 64K elements, 16K-element chunks, one trial")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--part")
    args = p.parse_args(argv)
    numel, chunk_numel = one_gpu.parse_size(args.numel), collective_time.NCCL_CHUNK_NUMEL
    links = [float(x) for x in args.link_gbyte_per_s.split(",")]
    if args.smoke:
        args.device, args.trials, numel, chunk_numel, links = "cpu", 1, 1 << 16, 1 << 14, [None]
    device = one_gpu.pick_device(args.device)
    cycles = spin_cycles_per_s() if device == "cuda" else None
    rows = [measure(wf, dt, link, numel, chunk_numel, device, args.trials, cycles)
            for wf in args.wire_formats.split(",") for dt in args.dtypes.split(",") for link in links]
    for r in rows:
        if r["overlap"] is None:
            print(f"{r['wire_format']:6s} {r['dtype']:9s} {r['chunks']} chunks: serial {r['serial_s'] * 1e3:8.3f} ms "
                  f"(overlap: none, {r['why_none']})")
        else:
            print(f"{r['wire_format']:6s} {r['dtype']:9s} link {r['link_gbyte_per_s']:5.0f} GB/s (modeled), "
                  f"{r['chunks']} chunks: codec {r['codec_s'] * 1e3:7.3f} ms, wire {r['wire_s'] * 1e3:7.3f}, serial "
                  f"{r['serial_s'] * 1e3:7.3f}, pipelined {r['pipelined_s'] * 1e3:7.3f}: overlap {r['overlap']:5.2f}")
    doc = {**one_gpu.header("overlap", device, args.smoke, LABELS, one_gpu.notes_of(__doc__)),
           "spin_cycles_per_s": cycles, "chunk_numel": chunk_numel, "rows": rows}
    if args.json:
        (one_gpu.write_part(args.json, args.part, doc) if args.part else one_gpu.write_whole(args.json, doc))
    return doc


if __name__ == "__main__":
    main()
