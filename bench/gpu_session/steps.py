"""The step tables: the GPU session's (SESSION) and the self-tests' (selftest).

The session in order of evidence per second, each step under its cap:
  env, wheels, build   alone (the build fixed: never scaled)
  the tests            four lanes side by side: the codec and cast tests (the
                       new codec kernels, then the legacy ones), the stream /
                       backend / eager-init tests, the multi-rank tests, and
                       compute-sanitizer's memcheck and racecheck
  the benchmarks       alone, after the tests so that nothing disturbs them:
                       the codec against a copy, a one-GPU run that predicts a
                       cluster (collective time at its chunk plan, interference
                       with a GEMM, overlap with a throttled wire, host enqueue
                       time), Fp8Linear, fp8nccl against nccl, the model, and
                       a ~1B training run (a hook: its script comes with issue 45)
The codec steps run both CUDA codec kernel sets (FP8COMM_CUDA_CODEC) side by
side, each in its own process (side_by_side.py); the linear bench both CUDA
cast kernel sets (FP8COMM_CUDA_CAST, the same two names), interleaved in one
process.
"""
from __future__ import annotations

import os

from .plan import Step

PY = "python3"
# The two CUDA codec kernel sets, chosen per process by FP8COMM_CUDA_CODEC;
# NEW is the one the model is fed with.
KERNEL_SETS = ("legacy", "tiled")
NEW = "tiled"
CODEC_ENV = "FP8COMM_CUDA_CODEC"

# The CUDA test files; each is run by exactly one test step (the legacy
# kernels' rerun of the codec tests aside).
CODEC_CAST_TESTS = ("tests/codec/test_codec_cuda.py", "tests/nn/test_fused_cast_cuda.py")
GEMM_TESTS = ("tests/nn/test_linear_cuda.py",)
SHARED_MEMORY_TESTS = ("tests/nn/test_fused_cast_cuda.py", "tests/codec/test_codec_cuda.py")
# The sanitizers' subset (of some 900 codec and cast cases): no torch.compile (minutes
# of compiling, no kernel of ours the rest does not run), no hypothesis; float16 left
# out (bfloat16's 2-byte paths), e5m2 and the casts' second FP8 dtype (e4m3's paths
# with another table), and for memcheck the 1M-element cases (the tails are in the
# small sizes). Each test's time is in the results log, to size these from.
# Racecheck leaves out Fp8Linear's tests: it stops on a hardware exception in
# cuBLASLt's FP8 GEMM (though it checks only our kernels), and their casts are
# the kernels the other cast tests run.
MEMCHECK_K = ("not compile and not hypothesis and not dtype2 and not e5m2 and not fp8_dtype1 and not 1048576 "
              "and not 1048583")
# Of the codec, racecheck runs the tiled NVFP4 cases alone: the codec's only
# kernels with shared memory (the segment amaxes and g of NVFP4).
RACECHECK_K = ("not compile and not dtype2 and not fp8_dtype1 and not fp8_linear and (test_fused_cast_cuda or "
               "(nvfp4 and tiled and not hypothesis and not 1048576 and not 1048583))")
CLUSTER_JSON = "{out}/cluster-1gpu.json"


def side_by_side(part: str | None, json_path: str, *command: str) -> tuple[str, ...]:
    """`command` once per kernel set, its rows merged into json_path (as `part` of it, if given)."""
    return (PY, "bench/gpu_session/side_by_side.py", "--sets", ",".join(KERNEL_SETS), "--json", json_path,
            "--each", "{work}", *(("--part", part) if part else ()), "--", *command)


SESSION = (
    Step("env", 30, (PY, "bench/gpu_session/env_check.py", "--path-file", "{work}/path_extra"), kind="env",
         fixed=True, what="GPU, compute mode, Python.h, compilers, ninja, nvcc, libcudart, torch"),
    Step("wheels", 10, ("bash", "-c", f"{PY} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "
                                      "--target {work}/site .whl/*.whl"), requires=".whl", pythonpath="{work}/site",
         what="Python wheels carried in .whl/ (torchao for the linear bench), installed outside the tree"),
    Step("build", 140, ("env", "TORCH_CUDA_ARCH_LIST=9.0", "MAX_JOBS={cores}", PY, "setup.py", "build_ext",
                        "--inplace", "--", PY, "bench/gpu_session/has_cuda.py"), kind="build", fixed=True,
         stops_on_failure=True, what="setup.py build_ext --inplace, judged by the extension importing with has_cuda"),
    Step("nvcc-check", 60, ("bash", ".ci/nvcc_check"), on_failure_of="build", tool="nvcc",
         what="after a failed build: the kernels compiled without torch"),
    # the tests: four lanes side by side
    Step("codec-cast-tests", 60, (*CODEC_CAST_TESTS, *GEMM_TESTS), kind="pytest", lane="codec",
         env=((CODEC_ENV, NEW),), what=f"bit-for-bit CUDA codec and cast tests, {NEW} kernels; Fp8Linear's GEMMs"),
    Step("codec-tests-legacy", 30, ("tests/codec/test_codec_cuda.py",), kind="pytest", lane="codec", drop=4,
         env=((CODEC_ENV, "legacy"),), what="the codec tests again on the legacy kernels"),
    Step("cuda-streams", 25, ("tests/backend/test_cuda_streams.py",), kind="pytest", lane="tests", drop=14,
         what="no host syncs, CUDA graph capture"),
    Step("cuda-backend", 40, ("-m", "not soak", "tests/backend/test_backend_cuda.py"), kind="pytest", lane="tests",
         drop=13, what="fp8nccl at world size 1"),
    # its own process: a world eagerly connected to NCCL, split, then destroyed
    Step("cuda-eager-init", 20, ("tests/backend/test_eager_init_cuda.py",), kind="pytest", lane="tests", drop=5,
         what="eager init on real NCCL"),
    Step("cuda-multirank", 80, ("tests/backend/test_cuda_multirank.py",), kind="pytest", lane="multirank",
         drop=11, what="2-4 ranks on one GPU, gloo transport"),
    Step("memcheck", 65, (*CODEC_CAST_TESTS, "-k", MEMCHECK_K), kind="sanitizer", lane="sanitizers", drop=9),
    Step("racecheck", 45, (*SHARED_MEMORY_TESTS, "-k", RACECHECK_K), kind="sanitizer", lane="sanitizers", drop=2),
    # the benchmarks, alone
    Step("codec-bench", 40, side_by_side(None, "{out}/codec.json", PY, "bench/codec.py", "--device", "cuda",
                                         "--sizes", "1M,16M,64M,256M", "--wire-format", "e4m3,e5m2,mxfp4,nvfp4",
                                         "--stochastic", "--json", "{json}"),
         kind="bench", drop=16, results=("codec.json",), table=(600, r"^== FP8COMM_CUDA_CODEC|^op |^[^ ]+ +e4m3 "),
         what="quantize / dequantize / sum GB/s against a copy, both kernel sets"),
    Step("collective-time", 30, side_by_side("collective_time", CLUSTER_JSON, PY, "bench/collective_time.py",
                                             "--json", "{json}"),
         kind="bench", drop=15, results=("cluster-1gpu.json",), table=(400, r"^== FP8COMM_CUDA_CODEC|^op |P=16"),
         what="GPU time of each collective's codec kernels at its chunk plan, P = 2..16"),
    Step("interference", 20, side_by_side("interference", CLUSTER_JSON, PY, "bench/interference.py",
                                          "--json", "{json}"),
         kind="bench", drop=10, results=("cluster-1gpu.json",), table=(60, r"^== FP8COMM_CUDA_CODEC|slowdown"),
         what="a Llama-3-8B GEMM's slowdown beside the codec on another stream"),
    Step("overlap", 20, side_by_side("overlap", CLUSTER_JSON, PY, "bench/overlap.py", "--json", "{json}"),
         kind="bench", drop=8, results=("cluster-1gpu.json",), table=(60, r"^== FP8COMM_CUDA_CODEC|overlap"),
         what="the chunked codec against a throttled copy standing in for the wire"),
    Step("enqueue", 15, (PY, "bench/enqueue.py", "--json", CLUSTER_JSON), kind="bench", drop=6,
         results=("cluster-1gpu.json",), table=(30, "."),
         what="host enqueue time against GPU time per compressed call, eager and in a CUDA graph"),
    Step("linear-bench", 75, (PY, "bench/linear.py", "--reps", "10", "--recipes", "tensorwise,rowwise,delayed",
                               "--casts", "--cast-sets", ",".join(KERNEL_SETS), "--compile-shapes",
                               "16384x4096x14336", "--json", "{out}/linear.json"),
         kind="bench", drop=7, results=("linear.json",), table=(40, "."),
         what="Llama-3-8B shapes: BF16, FP8 (tensorwise, rowwise, delayed) eager and fused casts, both CUDA cast "
              "kernel sets (FP8COMM_CUDA_CAST) side by side; compiled BF16, Fp8Linear and torchao at one shape"),
    Step("comm-bench", 15, ("torchrun", "--nproc_per_node=1", "-m", "fp8comm.bench.comm", "--max-bytes", "256M",
                            "--reps", "10", "--json", "{out}/comm-1rank.json"),
         kind="bench", drop=3, results=("comm-1rank.json",), table=(50, "."),
         what="fp8nccl against nccl at world size 1"),
    Step("model", 5, (PY, "bench/model.py", "--codec-json", f"{{work}}/codec-{NEW}.json", "--json",
                      "{out}/model.json"),
         kind="bench", drop=12, needs=("codec-bench",), results=("model.json",), table=(30, "."),
         what=f"the performance model fed with the measured codec ({NEW} kernels; modeled)"),
    # a hook: the ~1B-parameter training run of issue 45 brings this script
    Step("train-1b", 40, (PY, "bench/train_gpu.py", "--steps", "100", "--seq", "512", "--batch", "4", "--json",
                          "{out}/train-1b.json"),
         kind="bench", drop=1, results=("train-1b.json",), table=(30, "."),
         what="a ~1B Llama-style model, FSDP2 at world size 1: BF16 / Fp8Linear / torchao tokens/s and loss"),
)


def results(steps) -> list[str]:
    """The result files the steps write into $OUT, each once."""
    names: list[str] = []
    for s in steps:
        names += [r for r in s.results if r not in names]
    return names


SELFTEST_DIR = os.path.join("tests", "tools", "gpu_session_selftest")


def selftest(mode: str, python: str) -> tuple[Step, ...]:
    """Steps that exercise the runner itself without a GPU: a lane of a passing
    pytest run (failing in `selftest`) beside the main lane; the build judged
    by its import check (stand-in commands: in `selftest` both fail and the
    kernels' compile runs after it; in `selftest-pass` the build command fails
    after writing an extension that imports, which counts); in `selftest` also
    the env check with nothing on PATH, a failing run, one whose only test
    skips, a hung test that its per-test timeout fails while the run goes on,
    and a run cut at its step's cap; a passing pytest run under
    compute-sanitizer (a SKIP when none is found; the CPU tests put a stand-in
    on PATH); and a step after them all, which must still run. The fixtures
    are copied from tests/tools/gpu_session_selftest into {work}/selftest."""
    d = "{work}/selftest"
    cfg = (f"--rootdir={d}", "-c", f"{d}/pytest.ini")
    full = mode == "selftest"
    steps = [
        Step("selftest-background", 120, (*cfg, f"{d}/selftest_{'fail' if full else 'pass'}.py"), kind="pytest",
             lane="background"),
    ]
    if full:
        steps += [
            Step("selftest-env", 30, (python, "bench/gpu_session/env_check.py", "--no-torch"), kind="env",
                 lane="main", env=(("PATH", "{work}/empty-path"),)),
            Step("selftest-build", 30, ("bash", "-c", 'echo "csrc/stand-in.cpp:1:1: error: a stand-in compile error"; '
                                        "exit 1", "--", "false"), kind="build", lane="main"),
            Step("selftest-nvcc-check", 30, ("echo", "nvcc -c csrc/stand-in.cu"), on_failure_of="selftest-build",
                 tool="echo", lane="main"),
        ]
    else:
        steps.append(Step("selftest-build", 30, ("bash", "-c", 'echo "error: could not write to site-packages '
                                                 '(a stand-in)"; exit 1', "--", "true"), kind="build", lane="main"))
    steps.append(Step("selftest-pass", 120, (*cfg, f"{d}/selftest_pass.py"), kind="pytest", lane="main"))
    if full:
        steps += [
            Step("selftest-fail", 120, (*cfg, f"{d}/selftest_fail.py"), kind="pytest", lane="main"),
            Step("selftest-all-skipped", 120, (*cfg, f"{d}/selftest_skip.py"), kind="pytest", lane="main"),
            Step("selftest-hang", 60, (*cfg, f"{d}/selftest_hang.py"), kind="pytest", lane="main", test_timeout=1),
            Step("selftest-cut", 6, (*cfg, f"{d}/selftest_hang.py"), kind="pytest", lane="main", test_timeout=60),
        ]
    steps += [
        Step("memcheck", 120, (*cfg, f"{d}/selftest_pass.py"), kind="sanitizer", lane="main"),
        Step("selftest-after", 30, ("true",), lane="main"),
    ]
    return tuple(steps)
