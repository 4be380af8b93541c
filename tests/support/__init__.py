"""What the tests share: the multi-process harness, the reference codec and
error-bound oracle, inputs, the op-dispatch table, the scenarios that several test
modules run on their ranks (scenarios/; a module's own sit beside its tests),
CPU kernel detection and the host SIMT emulator (simt/)."""
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
