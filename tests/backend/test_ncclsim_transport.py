"""The fp8ncclsim transport (csrc/testing/ncclsim_transport.h) is a test
transport: it has one name, is registered from the private fp8comm._testing,
and reuses the backend's AVG / PREMUL_SUM emulation and its wait instead of
carrying copies that could drift from what fp8nccl runs."""
import importlib.util
import re

import fp8comm
from tests.support import REPO_ROOT

ROOT = REPO_ROOT
TEXT = {".py", ".h", ".cpp", ".cu", ".cuh", ".md", ".sh", ".txt", ".toml", ".cfg"}
THIS = "tests/backend/" + __name__.rsplit(".", 1)[-1] + ".py"


def _sources(*dirs):
    for d in dirs:
        path = ROOT / d
        for p in ([path] if path.is_file() else path.rglob("*")):
            rel = p.relative_to(ROOT).as_posix()
            if p.is_file() and p.suffix in TEXT and rel != THIS and "/build/" not in f"/{rel}":
                yield rel, p.read_text(errors="replace")


def test_the_test_backends_are_private():
    """No public fp8comm.testing, no alias to it, and nothing imports it."""
    assert importlib.util.find_spec("fp8comm.testing") is None
    assert not hasattr(fp8comm, "testing")
    assert importlib.util.find_spec("fp8comm._testing") is not None
    public = re.compile(r"fp8comm[./]testing\b|from fp8comm import (\w+, )*testing\b")
    found = sorted(rel for rel, text in _sources("csrc", "fp8comm", "tests", "bench", "examples", "docs",
                                                 "README.md", "DESIGN.md", "setup.py", "pyproject.toml")
                   if public.search(text))
    assert not found, f"fp8comm.testing is private now: use fp8comm._testing in {found}"


def test_the_transport_has_one_name():
    """The fp8ncclsim transport is called by that name only: its class and
    files after it, no older name left in code or prose."""
    old = re.compile("ncc" + r"l[-_ ]?like", re.IGNORECASE)
    found = sorted(rel for rel, text in _sources("csrc", "fp8comm", "tests", "bench", "examples", "docs",
                                                 "README.md", "DESIGN.md") if old.search(text))
    assert not found, f"call it the fp8ncclsim transport (NcclSimTransport in C++): {found}"
    assert hasattr(fp8comm._C, "_NcclSimTransport")
    assert sorted(p.name for p in (ROOT / "csrc" / "testing").iterdir()) == ["ncclsim_transport.cpp",
                                                                            "ncclsim_transport.h"]


def test_the_transport_reuses_the_backends_emulation_and_wait():
    """csrc/testing decides, emulates and waits with csrc/backend's
    is_avg_or_premul, emulate_reduce and wait_for: it names neither AVG nor
    PREMUL_SUM, premultiplies, divides nor waits on a Work itself, and defines
    no helper of its own for any of these."""
    texts = dict(_sources("csrc/testing"))
    assert texts
    own = re.compile(r"ReduceOp::(AVG|PREMUL_SUM)|\bpremultiplied\s*\(|\bdiv_?\s*\(|->\s*wait\s*\(")
    helper = re.compile(r"^[\w:<>,&*\s]*?\b(\w*(?:avg|premul|wait|sum_?inputs|write_?results)\w*)\s*\([^;{]*\)"
                        r"\s*(?:const\s*)?\{", re.IGNORECASE | re.MULTILINE)
    for rel, text in texts.items():
        code = re.sub(r"//[^\n]*", "", text)
        assert not own.search(code), f"{rel}: use emulated_reduce.h / wait_for.h, not {own.search(code).group(0)}"
        assert not helper.search(code), f"{rel} defines {helper.search(code).group(1)}: use csrc/backend's"
    cpp = texts["csrc/testing/ncclsim_transport.cpp"]
    for used in ('#include "../backend/emulated_reduce.h"', '#include "../backend/wait_for.h"',
                 "is_avg_or_premul(", "emulate_reduce(", "wait_for("):
        assert used in cpp, used
    # One wait_for, in csrc/backend, that the backend uses too.
    defs = [rel for rel, text in _sources("csrc") if re.search(r"\bvoid\s+wait_for\s*\(", text)]
    assert defs == ["csrc/backend/wait_for.h"], defs
    assert '#include "wait_for.h"' in (ROOT / "csrc/backend/compressible_ops.cpp").read_text()
