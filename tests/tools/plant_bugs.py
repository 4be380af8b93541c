"""Plants known bugs, one at a time, in a scratch copy of the tree and checks
that the fast test tier (`python -m pytest tests -q`, tests/support/tiers.py)
fails on each.

    python tests/tools/plant_bugs.py                 # every mutant
    python tests/tools/plant_bugs.py --only ef-residual-sign sr-key-without-rank
    python tests/tools/plant_bugs.py --list          # the mutants, and what each plants
    python tests/tools/plant_bugs.py --workdir DIR   # default /tmp/fp8comm-plant-bugs
    python tests/tools/plant_bugs.py --only NAME --tier full --hints-only
                                                     # does the full tier catch what the fast one misses?

Run it after any change to the tiers: a mutant the fast tier no longer
catches means the tier lost a case that mattered.

How it works:

1. The tree (tracked files and untracked ones git does not ignore) is copied
   into --workdir and built there in place once (`setup.py build_ext
   --inplace`, MAX_JOBS=2). The copy's build folder stays, so a later run, and
   each mutant's rebuild, compiles only what changed, and the link.
2. Each mutant is a small hand-made edit: its original text must occur in its
   file exactly once (else the mutant is stale and the script fails). The edit
   is applied, the extension rebuilt when a .cpp/.h file changed, this
   mutant's or the one before's (the .cu kernels need no build:
   tests/codec/test_kernels_on_host.py compiles them on the host, cached by a
   hash of the sources), and pytest (-x) run from the copy
   with PYTHONPATH=<copy> (so the copy's fp8comm is imported, not an editable
   install elsewhere): first on the mutant's hint files in the fast tier
   (--tier), then, only if those pass, on the whole fast tier. Then the file is restored; the
   next rebuild recompiles it, and a last rebuild leaves the copy clean.
3. A table of the outcomes is printed; the exit status is non-zero if any
   mutant was not caught (or could not be planted or built).

Logs of every build and pytest run are kept in <workdir>/.plant-bugs-logs/.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_WORKDIR = Path("/tmp/fp8comm-plant-bugs")
LOGS = ".plant-bugs-logs"
# Names the file a mutant is planted in until the copy is rebuilt clean: a run
# that died in between leaves it, and the next run touches that file so its
# build does not keep the mutant's object (the copy keeps the tree's mtimes).
DIRTY = Path(LOGS) / "dirty"
# Kept from an earlier run of the copy so its build is incremental.
KEEP = ("build", LOGS)
BUILT_SUFFIXES = (".cpp", ".h")  # what the extension compiles; .cu/.cuh only the host-emulation test does


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository root
    old: str  # occurs exactly once in `path`
    new: str
    hints: tuple[str, ...]  # the test files (or node ids) expected to catch it, in the fast tier
    plants: str  # the bug, in words

    @property
    def needs_build(self) -> bool:
        return self.path.endswith(BUILT_SUFFIXES)


MUTANTS = [
    Mutant(
        name="cuda-shuffle",
        path="csrc/codec/codec_cuda.cu",
        old="  for (int off = 16; off >= 1; off /= 2) {\n    const uint32_t other",
        new="  for (int off = 16; off > 1; off /= 2) {\n    const uint32_t other",
        hints=("tests/codec/test_kernels_on_host.py",),
        plants="warp_max's butterfly stops one shuffle early (lanes 2k and 2k+1 never meet): block and segment amaxes",
    ),
    Mutant(
        name="avx2-block-boundary",
        path="csrc/codec/codec_cpu_avx2.cpp",
        old="for (int64_t i = 4 * b; i < 4 * b + 4; ++i) {",
        new="for (int64_t i = 4 * b; i < 4 * b + 3; ++i) {",
        hints=("tests/codec/test_codec_simd.py",),
        plants="AVX2 quantize_group_normal: each block's amax pass ends one vector before the block does",
    ),
    Mutant(
        name="avx512-block-boundary",
        path="csrc/codec/codec_cpu_avx512.cpp",
        old="store_codes16<F>(codes + code_bytes<F>(kBlock * b + 16), ",
        new="store_codes16<F>(codes + code_bytes<F>(kBlock * b + 15), ",
        hints=("tests/codec/test_codec_simd.py",),
        plants="AVX-512 quantize_group: a block's second half of codes is stored one element early",
    ),
    Mutant(
        name="scale-exponent-rounding",
        path="csrc/codec/fp8_block_math.h",
        old="((amax_bits & 0x7FFFFFu) > WireTraits<F>::kMaxMantissa ? 1 : 0)",
        new="((amax_bits & 0x7FFFFFu) >= WireTraits<F>::kMaxMantissa ? 1 : 0)",
        hints=("tests/codec/test_codec.py",),
        plants="scale_exponent rounds up when amax's mantissa equals the format's largest (amax = max * 2^e)",
    ),
    # The scale boundaries (tests/codec/test_scale_boundaries.py): a scale rule
    # that rounds the wrong way only at equality, in each path that has its own.
    Mutant(
        name="nvfp4-segment-scale-rounding",
        path="csrc/codec/fp8_block_math.h",
        old="((amax_bits & 0x7FFFFFu) > (limit_bits & 0x7FFFFFu) ? 1 : 0)",
        new="((amax_bits & 0x7FFFFFu) >= (limit_bits & 0x7FFFFFu) ? 1 : 0)",
        hints=("tests/codec/test_scale_boundaries.py",),
        plants="segment_scale rounds up when the segment amax is exactly 6 * 448 * 2^k: NVFP4's g doubles there, "
               "in every path (CPU, SIMD and CUDA share it)",
    ),
    Mutant(
        name="simd-scale-exponent-rounding",
        path="csrc/codec/codec_cpu_x86.h",
        old="_mm256_cmpgt_epi32(_mm256_and_si256(amax, splat(0x7FFFFF)), splat(T::kMaxMantissa))",
        new="_mm256_cmpgt_epi32(_mm256_and_si256(amax, splat(0x7FFFFF)), splat(T::kMaxMantissa - 1))",
        hints=("tests/codec/test_scale_boundaries.py",),
        plants="x86::plain_scales (the AVX2 and AVX-512 group kernels' E8M0 scales) rounds up at amax = fmax * 2^k",
    ),
    Mutant(
        name="avx2-nvfp4-block-scale-bump",
        path="csrc/codec/codec_cpu_avx2.cpp",
        old="_mm256_cmp_ps(ceiling, a, _CMP_LT_OQ)",
        new="_mm256_cmp_ps(ceiling, a, _CMP_LE_OQ)",
        hints=("tests/codec/test_scale_boundaries.py",),
        plants="e4m3_segment_scales8 (AVX2 NVFP4 block scales) takes the next E4M3 code already at amax = "
               "7 * value(c) * g, not only above it",
    ),
    Mutant(
        name="cuda-segment-scale-one-ulp-early",
        path="csrc/codec/codec_cuda.cu",
        old="store_segment_scale<F>(dst.scales + r * dst.stride, segment_scale<F>(amax));\n    } else if (amax != 0) {",
        new="store_segment_scale<F>(dst.scales + r * dst.stride, segment_scale<F>(amax + (amax != 0)));\n"
            "    } else if (amax != 0) {",
        hints=("tests/codec/test_scale_boundaries.py",),
        plants="segment_amax_kernel (one warp per segment) takes g of the amax one ulp up: a segment amax of "
               "exactly 6 * 448 * 2^k gets twice its g",
    ),
    Mutant(
        name="cuda-block-scale-one-ulp-early",
        path="csrc/codec/codec_cuda.cu",
        old="const uint8_t sb = block_scale_byte<F>(amax, g);\n    encode_chunk<F>",
        new="const uint8_t sb = block_scale_byte<F>(amax + (amax != 0), g);\n    encode_chunk<F>",
        hints=("tests/codec/test_scale_boundaries.py",),
        plants="quantize_shuffle_kernel takes block scales of the amax one ulp up: twice the E8M0 scale at amax = "
               "fmax * 2^k, NVFP4's E4M3 scale off at its ties and at 7 * value(c) * g",
    ),
    Mutant(
        name="owner-segment-off-by-one",
        path="csrc/algorithms/all_reduce.cpp",
        old="own{segments_of(elements(c), rank, 1, c.m)",
        new="own{segments_of(elements(c), rank + 1, 1, c.m)",
        hints=("tests/backend/test_backend_collectives.py",),
        plants="all_reduce: the owner adds the next rank's segment of its input to the pieces, not its own",
    ),
    Mutant(
        name="chunk-boundary-off-by-one",
        path="csrc/algorithms/chunk_plan.cpp",
        old="Chunk c{begin, std::min(step, numel - begin),",
        new="Chunk c{begin, std::min(step - 1, numel - begin),",
        hints=("tests/backend/test_chunk_plan.py",),
        plants="chunk_plan: every full chunk ends one element short (the last element before a boundary is dropped)",
    ),
    Mutant(
        name="sr-key-without-rank",
        path="csrc/algorithms/wire_layout.cpp",
        old="w.rounding_key_ = mix_key(mix_key(mix_key(0, static_cast<uint64_t>(seed)), call), static_cast<uint64_t>(rank));",
        new="w.rounding_key_ = mix_key(mix_key(0, static_cast<uint64_t>(seed)), call);",
        hints=("tests/codec/test_stochastic_rounding.py::test_ranks_round_independently",),
        plants="WireLayout::for_call: the stochastic-rounding key leaves out the rank (every rank draws the same bits)",
    ),
    Mutant(
        name="fingerprint-drops-field",
        path="csrc/backend/options_table.h",
        old='X(scope, Scope, choices(), "FP8COMM_SCOPE", "all", kGroup,',
        new='X(scope, Scope, choices(), "FP8COMM_SCOPE", "all", kRank,',
        hints=("tests/backend/test_options_agreement.py",),
        plants="the scope row is per rank, so Options::fingerprint leaves it out: ranks that disagree on it create "
               "the group",
    ),
    Mutant(
        name="ef-residual-sign",
        path="csrc/algorithms/residual.cpp",
        old="at::Tensor r = q.values - q.decoded;",
        new="at::Tensor r = q.decoded - q.values;",
        hints=("tests/backend/test_error_feedback.py",),
        plants="keep_residual keeps decoded - value: error feedback adds the quantization error back twice",
    ),
    # The all_to_all split check (tests/backend/test_split_check_positions.py):
    # a check that skips one position lets that disagreement move data, where
    # one rank fails alone or every rank goes on with wrong sizes.
    Mutant(
        name="split-check-skips-last-rank",
        path="csrc/algorithms/all_to_all_splits.cpp",
        old="    for (int64_t d = 0; d < table.P; ++d) {\n      TORCH_CHECK(table.sends(s, d)",
        new="    for (int64_t d = 0; d < table.P - 1; ++d) {\n      TORCH_CHECK(table.sends(s, d)",
        hints=("tests/backend/test_split_check_positions.py",),
        plants="check_splits never checks what a rank sends the last rank: split sizes that disagree there are "
               "not refused on every rank",
    ),
    Mutant(
        name="split-check-skips-own-slice",
        path="csrc/algorithms/all_to_all_splits.cpp",
        old="    for (int64_t d = 0; d < table.P; ++d) {\n      TORCH_CHECK(table.sends(s, d)",
        new="    for (int64_t d = 0; d < table.P; ++d) {\n      if (d == s) continue;\n"
            "      TORCH_CHECK(table.sends(s, d)",
        hints=("tests/backend/test_split_check_positions.py",),
        plants="check_splits never checks a rank's own slice (what it sends itself against what it expects "
               "from itself)",
    ),
    Mutant(
        name="passthrough-compresses",
        path="csrc/backend/process_group_fp8.cpp",
        old="if (per_rank_numel < *options_->min_numel) {",
        new="if (per_rank_numel < *options_->min_numel - 1) {",
        hints=("tests/backend/test_reliability.py::test_min_numel_boundary",),
        plants="ProcessGroupFp8::passthrough: a call of min_numel - 1 elements per rank is compressed, not passed "
               "through",
    ),
]
BY_NAME = {m.name: m for m in MUTANTS}


@dataclasses.dataclass
class Outcome:
    mutant: Mutant
    caught: bool = False
    by: str = ""  # the first failing test's node id, or why there is none
    stage: str = ""  # "hints", "fast tier", or what went wrong
    build_s: float = 0.0
    test_s: float = 0.0


class Stale(Exception):
    """A mutant's original text is not in its file exactly once."""


# ---------------------------------------------------------------- the copy
def tree_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         check=True, capture_output=True).stdout
    # a tracked file deleted in the work tree is not copied
    return [p for p in out.decode().split("\0") if p and os.path.lexists(REPO / p)]


def copy_tree(workdir: Path) -> None:
    """The tree into `workdir`, replacing an earlier copy but its build folder
    (and the built extension, rebuilt anyway if stale)."""
    if workdir.exists():
        for entry in workdir.iterdir():
            if entry.name in KEEP:
                continue
            if entry.name == "fp8comm":  # keep fp8comm/_C*.so, the in-place build
                for sub in entry.iterdir():
                    if not sub.name.startswith("_C"):
                        shutil.rmtree(sub) if sub.is_dir() and not sub.is_symlink() else sub.unlink()
                continue
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / LOGS).mkdir(exist_ok=True)
    names = "\0".join(tree_files()).encode()
    pack = subprocess.Popen(["tar", "-C", str(REPO), "--null", "-T", "-", "-cf", "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    unpack = subprocess.Popen(["tar", "-C", str(workdir), "-xf", "-"], stdin=pack.stdout)
    pack.stdout.close()
    pack.stdin.write(names)
    pack.stdin.close()
    if pack.wait() != 0 or unpack.wait() != 0:
        sys.exit("plant_bugs: copying the tree failed")
    dirty = workdir / DIRTY
    if dirty.exists():
        for path in dirty.read_text().split():
            if (workdir / path).exists():
                (workdir / path).touch()


def build(workdir: Path, log_name: str) -> tuple[bool, float]:
    """Builds the copy's extension in place; (succeeded, seconds)."""
    log = workdir / LOGS / f"{log_name}.build.log"
    env = dict(os.environ, MAX_JOBS="2")
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=workdir, env=env,
                            stdout=f, stderr=subprocess.STDOUT).returncode
    return rc == 0, time.monotonic() - t0


def test_env(workdir: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(workdir))
    env.pop("FP8COMM_TEST_TIER", None)  # --tier decides
    return env


def check_import(workdir: Path) -> None:
    """The copy's fp8comm (and its extension) is the one the tests import."""
    code = "import fp8comm, fp8comm._C as c; print(fp8comm.__file__); print(c.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=test_env(workdir), capture_output=True,
                         text=True)
    paths = out.stdout.split()
    print(f"plant_bugs: the tests import {' and '.join(paths) or out.stderr.strip()}")
    if out.returncode != 0 or not all(Path(p).resolve().is_relative_to(workdir.resolve()) for p in paths):
        sys.exit(f"plant_bugs: the scratch copy's fp8comm is not the one imported from {workdir}")


# ---------------------------------------------------------------- pytest
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def run_pytest(workdir: Path, targets: list[str], tier: str, log_name: str) -> tuple[int, str, float]:
    """pytest -x on `targets` in `tier`: (return code, first failing node id or "", seconds)."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider", "--tier", tier, *targets]
    log = workdir / LOGS / f"{log_name}.pytest.log"
    t0 = time.monotonic()
    with open(log, "w") as f:  # written as it runs: `tail -f` shows a long run's progress
        f.write(" ".join(cmd) + "\n\n")
        f.flush()
        rc = subprocess.run(cmd, cwd=workdir, env=test_env(workdir), stdout=f, stderr=subprocess.STDOUT).returncode
    seconds = time.monotonic() - t0
    failed = FAILED.search(log.read_text())
    return rc, failed.group(1) if failed else "", seconds


# A test process that dies of one of these crashed in the code under test: caught.
CRASHES = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE}


def judge(rc: int, node: str) -> tuple[bool, str]:
    """(caught, what caught it) from a pytest run. 0: passed; 1: tests failed;
    2: collection errors; 5: nothing collected; a crash counts as caught, a
    kill from outside (a timeout, Ctrl-C) does not."""
    if rc == 0:
        return False, ""
    if rc == 5:
        return False, "(no tests collected)"
    if rc < 0:
        if -rc in CRASHES:
            return True, node or f"(pytest died of {signal.Signals(-rc).name})"
        return False, f"(pytest killed by {signal.Signals(-rc).name}: no verdict)"
    return True, node or f"(pytest exit status {rc}, no failing test named)"


# ---------------------------------------------------------------- mutants
def check_fresh(workdir: Path, m: Mutant) -> str:
    """The text of m's file in the copy; raises Stale unless m.old occurs there exactly once."""
    text = (workdir / m.path).read_text()
    count = text.count(m.old)
    if count != 1:
        raise Stale(f"{m.name}: its original text occurs {count} times in {m.path} (expected once): "
                    f"the mutant is stale, update it")
    return text


def apply(workdir: Path, m: Mutant) -> str:
    """Plants `m` in the copy; returns the file's original text."""
    text = check_fresh(workdir, m)
    with open(workdir / DIRTY, "a") as f:
        f.write(m.path + "\n")
    (workdir / m.path).write_text(text.replace(m.old, m.new))
    return text


def run_mutant(workdir: Path, m: Mutant, tier: str, hints_only: bool, rebuild: bool) -> Outcome:
    """Plants m, builds when m or the mutant before it changed a built file
    (the extension must not keep the previous mutant), runs the tests, restores."""
    result = Outcome(m)
    original = apply(workdir, m)
    try:
        if rebuild:
            ok, result.build_s = build(workdir, m.name)
            if not ok:
                result.stage, result.by = "build failed", f"see {LOGS}/{m.name}.build.log"
                return result
        rc, node, seconds = run_pytest(workdir, list(m.hints), tier, f"{m.name}.{tier}.hints")
        result.test_s += seconds
        result.caught, result.by = judge(rc, node)
        result.stage = "hints"
        if rc == 5:
            result.stage = "hints collected nothing"
            return result
        if not result.caught and not hints_only:
            print(f"plant_bugs: {m.name}: its hints pass; running the whole {tier} tier "
                  f"(progress: {workdir / LOGS / f'{m.name}.{tier}.pytest.log'})", flush=True)
            rc, node, seconds = run_pytest(workdir, ["tests"], tier, f"{m.name}.{tier}")
            result.test_s += seconds
            result.caught, result.by = judge(rc, node)
            result.stage = f"{tier} tier"
        return result
    finally:
        (workdir / m.path).write_text(original)


def print_table(outcomes: list[Outcome]) -> None:
    rows = [("mutant", "result", "stage", "build s", "test s", "first failing test")]
    for o in outcomes:
        rows.append((o.mutant.name, "caught" if o.caught else "NOT CAUGHT", o.stage, f"{o.build_s:.0f}",
                     f"{o.test_s:.0f}", o.by))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    print()
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=list(BY_NAME), help="run only these mutants")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help=f"the scratch copy (default {DEFAULT_WORKDIR})")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--tier", choices=("fast", "full", "all"), default="fast",
                        help="the tier the tests run in (default fast, the one this script checks; full: which "
                             "full-tier test catches a mutant the fast tier misses)")
    parser.add_argument("--hints-only", action="store_true",
                        help="run only the hints, not the whole tier after hints that pass")
    args = parser.parse_args(argv)

    mutants = [BY_NAME[n] for n in args.only] if args.only else MUTANTS
    if args.list:
        for m in mutants:
            print(f"{m.name}\n    {m.path}: {m.plants}\n    hints: {' '.join(m.hints)}")
        return 0
    workdir = args.workdir.resolve()
    if workdir == REPO or REPO.is_relative_to(workdir):
        sys.exit(f"plant_bugs: --workdir {workdir} would overwrite the tree itself")

    print(f"plant_bugs: copying {REPO} to {workdir}", flush=True)
    copy_tree(workdir)
    try:
        for m in mutants:  # every mutant checked before the slow part
            check_fresh(workdir, m)
    except Stale as e:
        sys.exit(f"plant_bugs: {e}")
    print("plant_bugs: building the copy", flush=True)
    ok, seconds = build(workdir, "clean")
    if not ok:
        sys.exit(f"plant_bugs: the unmutated copy does not build; see {workdir / LOGS / 'clean.build.log'}")
    print(f"plant_bugs: built in {seconds:.0f} s", flush=True)
    check_import(workdir)

    outcomes = []
    built_mutant = False  # the extension holds the last mutant's objects
    try:
        for m in mutants:
            print(f"plant_bugs: {m.name}: {m.path}: {m.plants}", flush=True)
            o = run_mutant(workdir, m, args.tier, args.hints_only, rebuild=m.needs_build or built_mutant)
            built_mutant = m.needs_build
            print(f"plant_bugs: {m.name}: {'caught' if o.caught else 'NOT CAUGHT'} ({o.stage}) {o.by} "
                  f"[build {o.build_s:.0f} s, tests {o.test_s:.0f} s]", flush=True)
            outcomes.append(o)
    finally:
        ok = True
        if built_mutant:  # the restored sources rebuilt: the copy is clean again
            ok, _ = build(workdir, "restored")
            if not ok:
                print(f"plant_bugs: rebuilding the restored copy failed; see {workdir / LOGS}", file=sys.stderr)
        if ok:
            (workdir / DIRTY).unlink(missing_ok=True)
    print_table(outcomes)
    missed = [o.mutant.name for o in outcomes if not o.caught]
    if missed:
        where = "their hints" if args.hints_only else f"the {args.tier} tier"
        print(f"\nplant_bugs: NOT CAUGHT by {where}: {', '.join(missed)}")
        return 1
    print(f"\nplant_bugs: the {args.tier} tier caught all {len(outcomes)} mutants")
    return 0


if __name__ == "__main__":
    sys.exit(main())
