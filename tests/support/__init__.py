"""What the tests share: the multi-process harness, the reference codec and
error-bound oracle, inputs, the op-dispatch table, the scenarios the worker
processes run, CPU kernel detection and the host SIMT emulator (simt/)."""
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
