"""build_speed.py, without building: which units are torch-free, and the two
ninja calls it makes in place of torch's one (a stand-in for torch's ninja
compile records them; a stand-in compiler writes the precompiled header)."""
import importlib.util
import os
import stat

from tests.support import REPO_ROOT

spec = importlib.util.spec_from_file_location("fp8comm_build_speed", REPO_ROOT / "build_speed.py")
bs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bs)
CSRC = REPO_ROOT / "csrc"


def test_the_kernels_are_torch_free_and_the_backend_is_not():
    # DESIGN.md: the x86 kernels and the CUDA kernels compile without torch's headers.
    cuda = sorted(str(p.relative_to(CSRC)) for p in CSRC.rglob("*.cu"))
    assert {"codec/codec_cuda.cu", "codec/codec_cuda_tiled.cu", "linear/cast_cuda.cu",
            "linear/cast_cuda_tiled.cu"} <= set(cuda), cuda
    for unit in ("codec/codec_cpu_avx2.cpp", "codec/codec_cpu_avx512.cpp", *cuda):
        assert not bs.includes_torch(str(CSRC / unit)), unit
    for unit in ("bindings.cpp", "backend/process_group_fp8.cpp", "codec/codec_ops.cpp"):
        assert bs.includes_torch(str(CSRC / unit)), unit


def test_torch_is_found_through_the_projects_own_headers(tmp_path):
    (tmp_path / "inner.h").write_text("#include <ATen/ATen.h>\n")
    (tmp_path / "outer.h").write_text('#include "inner.h"\n')
    (tmp_path / "a.cpp").write_text('#include "outer.h"\n')
    (tmp_path / "b.cpp").write_text('#include <vector>\n#include "missing.h"\n')
    assert bs.includes_torch(str(tmp_path / "a.cpp"), str(tmp_path))
    assert not bs.includes_torch(str(tmp_path / "b.cpp"), str(tmp_path))


def test_longest_first(tmp_path):
    for name, size in (("small.cpp", 10), ("big.cpp", 300), ("mid.cpp", 100)):
        (tmp_path / name).write_text("x" * size)
    names = [os.path.basename(p) for p in bs.longest_first([str(tmp_path / n) for n in ("small.cpp", "big.cpp", "mid.cpp")])]
    assert names == ["big.cpp", "mid.cpp", "small.cpp"]


def fake_compiler(tmp_path, fails=False):
    """A `g++` that writes the file after -o (the precompiled header), or fails."""
    path = tmp_path / "bin" / "g++"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\nexit 1\n" if fails else
                    '#!/bin/sh\nwhile [ $# -gt 0 ]; do if [ "$1" = -o ]; then echo gch > "$2"; fi; shift; done\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def compile_with(tmp_path, compiler):
    calls = []
    sources = [str(CSRC / u) for u in ("codec/codec_cpu_avx2.cpp", "bindings.cpp", "codec/codec_cuda.cu",
                                        "codec/codec_ops.cpp")]
    objects = [s + ".o" for s in sources]
    bs.compile_objects(lambda **kw: calls.append(kw), compiler, sources=sources, objects=objects,
                       cflags=["-O3", "-c"], post_cflags=["-std=c++20"], build_directory=str(tmp_path / "build"),
                       with_cuda=True, verbose=False)
    return calls


def test_torch_free_units_first_then_the_rest_with_the_precompiled_header(tmp_path):
    calls = compile_with(tmp_path, fake_compiler(tmp_path))
    first, second = calls
    assert {os.path.basename(s) for s in first["sources"]} == {"codec_cuda.cu", "codec_cpu_avx2.cpp"}
    assert first["sources"] == bs.longest_first(first["sources"])
    assert first["with_cuda"] and "-include" not in first["post_cflags"]
    assert [os.path.basename(s) for s in second["sources"]] == ["bindings.cpp", "codec_ops.cpp"]
    assert [os.path.basename(o) for o in second["objects"]] == ["bindings.cpp.o", "codec_ops.cpp.o"]
    header = second["post_cflags"][second["post_cflags"].index("-include") + 1]
    assert os.path.isfile(header + ".gch") and not second["with_cuda"]
    # a second build with the same command and torch reuses the header
    before = os.path.getmtime(header + ".gch")
    compile_with(tmp_path, str(tmp_path / "bin" / "g++"))
    assert os.path.getmtime(header + ".gch") == before


def test_a_failed_precompile_leaves_the_units_parsing_the_headers(tmp_path, capfd):
    first, second = compile_with(tmp_path, fake_compiler(tmp_path, fails=True))
    assert "-include" not in second["post_cflags"]
    assert "precompiling torch's headers failed" in capfd.readouterr().err
