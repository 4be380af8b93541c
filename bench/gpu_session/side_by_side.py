"""A benchmark once per CUDA codec kernel set, side by side in one JSON.

    python3 bench/gpu_session/side_by_side.py --sets legacy,tiled --json PATH [--part KEY] [--each DIR] \\
        -- CMD... --json {json}

Runs CMD once per set, each in its own process with FP8COMM_CUDA_CODEC=SET
(the variable picks the kernels a process runs), "{json}" in CMD replaced by
a file of its own; then writes PATH: {"kernel_sets": [...], "runs": {set: its
JSON}, "rows": every run's rows, each with "cuda_codec": set}, or that as
PATH's `part` (other parts of PATH kept). --each DIR also keeps each run's
JSON as DIR/<stem>-<set>.json (the model reads the new set's codec figures).
Each run's JSON records the variable as its process saw it; a build that
does not know the variable runs the same kernels in every set.
A set whose run fails fails the command, after the other sets ran.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
from json_parts import write_part, write_whole  # noqa: E402

VARIABLE = "FP8COMM_CUDA_CODEC"


def merge(runs: dict) -> dict:
    """{set: JSON} -> the side-by-side document."""
    rows = []
    for name, doc in runs.items():
        for r in doc.get("rows", []):
            rows.append({**r, "cuda_codec": name})
    first = next(iter(runs.values()), {})
    return {"benchmark": first.get("benchmark"), "kernel_sets": list(runs), "kernel_set_variable": VARIABLE,
            "runs": runs, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sets", required=True, help="comma list of FP8COMM_CUDA_CODEC values")
    p.add_argument("--json", required=True)
    p.add_argument("--part")
    p.add_argument("--each", help="a folder for each set's own JSON")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not any("{json}" in a for a in command):
        p.error("the command after -- must name its JSON file as {json}")
    tmp = tempfile.mkdtemp(prefix="side-by-side-")
    runs, failed = {}, []
    try:
        for name in args.sets.split(","):
            path = os.path.join(tmp, f"{name}.json")
            argv_set = [a.replace("{json}", path) for a in command]
            print(f"== {VARIABLE}={name}: {' '.join(argv_set)}", flush=True)
            rc = subprocess.call(argv_set, env={**os.environ, VARIABLE: name})
            if rc != 0 or not os.path.exists(path):
                print(f"== {VARIABLE}={name}: exit {rc}{'' if os.path.exists(path) else ', no JSON written'}",
                      flush=True)
                failed.append(name)
                continue
            with open(path) as f:
                runs[name] = json.load(f)
            if args.each:
                stem = os.path.splitext(os.path.basename(args.json))[0] if not args.part else args.part
                shutil.copy(path, os.path.join(args.each, f"{stem}-{name}.json"))
        if runs:
            (write_part(args.json, args.part, merge(runs)) if args.part else write_whole(args.json, merge(runs)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failed:
        print(f"== failed kernel sets: {', '.join(failed)}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
