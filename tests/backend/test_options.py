"""fp8comm.Options, the c10d::Backend::Options of fp8nccl / fp8gloo, and the
environment variables fp8comm reads: each knob declared once, as a row of
csrc/backend/options_table.h, the other variables in csrc/common/env.h; the
README and DESIGN tables are the rows'."""
import copy
import pickle
import re

import pytest
import torch
from torch._C._distributed_c10d import Backend

import fp8comm
from fp8comm.options import defaults_call, environment_table, environment_variables, knob_table, option_table
from tests.support import REPO_ROOT

ROOT = REPO_ROOT
ROWS = option_table()
WIRE_FORMATS = [name for name, *_ in fp8comm._C.wire_formats()]


def choices(names):
    """How errors list values: 'a', 'b' or 'c'."""
    quoted = [f"'{n}'" for n in names]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1]


def test_options_are_a_c10d_backend_options():
    assert isinstance(fp8comm.Options(), Backend.Options)


def test_unset_fields_stay_unset_until_resolved(monkeypatch):
    opts = fp8comm.Options(min_numel=7)
    assert opts.block_size is None and opts.wire_format is None and opts.compress is None and opts.min_numel == 7
    monkeypatch.setenv("FP8COMM_WIRE_FORMAT", "MXFP4")
    monkeypatch.setenv("FP8COMM_COMPRESS", "all")
    r = opts.resolved()
    assert (r.block_size, r.wire_format, r.min_numel) == (32, "mxfp4", 7)
    assert r.compress == ("all_reduce", "reduce_scatter", "all_gather")
    assert r.fingerprint() == {"block_size": "32", "wire_format": "mxfp4", "min_numel": "7",
                               "compress": "all_reduce,reduce_scatter,all_gather", "scope": "all",
                               "node_wire_format": "exact", "rounding": "nearest", "rounding_seed": "0"}


def test_scope_from_the_option_or_the_environment(monkeypatch):
    assert fp8comm.Options().scope is None
    assert fp8comm.Options().resolved().scope == "all"
    assert fp8comm.Options(scope="inter_node").resolved().fingerprint()["scope"] == "inter_node"
    monkeypatch.setenv("FP8COMM_SCOPE", "inter_node")
    assert fp8comm.Options().resolved().scope == "inter_node"
    assert fp8comm.Options(scope="all").resolved().scope == "all"
    monkeypatch.setenv("FP8COMM_SCOPE", "nodes")
    with pytest.raises(ValueError, match="scope must be 'all' or 'inter_node', got 'nodes' \\(from FP8COMM_SCOPE\\)"):
        fp8comm.Options().resolved()


def test_node_wire_format_from_the_option_or_the_environment(monkeypatch):
    assert fp8comm.Options().node_wire_format is None
    assert fp8comm.Options().resolved().node_wire_format == "exact"
    r = fp8comm.Options(scope="inter_node", node_wire_format="e4m3").resolved()
    assert r.node_wire_format == "e4m3" and r.fingerprint()["node_wire_format"] == "e4m3"
    monkeypatch.setenv("FP8COMM_NODE_WIRE_FORMAT", "mxfp4")
    monkeypatch.setenv("FP8COMM_SCOPE", "inter_node")
    assert fp8comm.Options().resolved().node_wire_format == "mxfp4"
    assert fp8comm.Options(node_wire_format="exact").resolved().node_wire_format == "exact"
    # The variable is for inter_node groups: a group given scope="all" has no node phases.
    assert fp8comm.Options(scope="all").resolved().node_wire_format == "exact"


def test_node_wire_format_needs_the_inter_node_scope(monkeypatch):
    with pytest.raises(ValueError, match="node_wire_format='e4m3' sets the inter_node scope's phases inside a node, "
                                         "but scope is 'all'; set scope='inter_node'"):
        fp8comm.Options(node_wire_format="e4m3").resolved()
    with pytest.raises(ValueError, match="but scope is 'all'"):
        fp8comm.Options(node_wire_format="e5m2", scope="all").resolved()
    monkeypatch.setenv("FP8COMM_NODE_WIRE_FORMAT", "e4m3")  # FP8COMM_SCOPE left at all: forgotten
    with pytest.raises(ValueError, match="but scope is 'all'"):
        fp8comm.Options().resolved()


@pytest.mark.parametrize("value", ["fp8", "E4M3 ", 8])
def test_node_wire_format_must_be_exact_or_a_wire_format(value):
    expected = f"node_wire_format must be {choices(['exact'] + WIRE_FORMATS)}, got {value!r}"
    with pytest.raises(ValueError, match=re.escape(expected)):
        fp8comm.Options(node_wire_format=value)


def test_node_wire_format_from_the_environment_is_checked(monkeypatch):
    monkeypatch.setenv("FP8COMM_NODE_WIRE_FORMAT", "int8")
    with pytest.raises(ValueError, match="got 'int8' \\(from FP8COMM_NODE_WIRE_FORMAT\\)"):
        fp8comm.Options(scope="inter_node").resolved()


def test_rounding_from_the_option_or_the_environment(monkeypatch):
    monkeypatch.delenv("FP8COMM_ROUNDING", raising=False)
    monkeypatch.delenv("FP8COMM_ROUNDING_SEED", raising=False)
    assert fp8comm.Options().rounding is None and fp8comm.Options().rounding_seed is None
    r = fp8comm.Options().resolved()
    assert (r.rounding, r.rounding_seed) == ("nearest", 0)
    r = fp8comm.Options(rounding="stochastic", rounding_seed=-5).resolved()
    assert r.fingerprint()["rounding"] == "stochastic" and r.fingerprint()["rounding_seed"] == "-5"
    monkeypatch.setenv("FP8COMM_ROUNDING", "stochastic")
    monkeypatch.setenv("FP8COMM_ROUNDING_SEED", "42")
    assert (fp8comm.Options().resolved().rounding, fp8comm.Options().resolved().rounding_seed) == ("stochastic", 42)
    assert fp8comm.Options(rounding="nearest", rounding_seed=1).resolved().rounding_seed == 1
    monkeypatch.setenv("FP8COMM_ROUNDING", "random")
    with pytest.raises(ValueError, match="rounding must be 'nearest' or 'stochastic', got 'random' "
                                         "\\(from FP8COMM_ROUNDING\\)"):
        fp8comm.Options().resolved()
    monkeypatch.setenv("FP8COMM_ROUNDING", "nearest")
    monkeypatch.setenv("FP8COMM_ROUNDING_SEED", "x")
    with pytest.raises(ValueError, match="rounding_seed must be an int, got 'x' \\(from FP8COMM_ROUNDING_SEED\\)"):
        fp8comm.Options().resolved()


@pytest.mark.parametrize("value", ["up", 1, True])
def test_rounding_must_be_a_known_name(value):
    with pytest.raises(ValueError, match="rounding must be 'nearest' or 'stochastic'"):
        fp8comm.Options(rounding=value)


@pytest.mark.parametrize("value", [1.5, "7", True])
def test_rounding_seed_must_be_an_int(value):
    with pytest.raises(ValueError, match="rounding_seed must be an int"):
        fp8comm.Options(rounding_seed=value)


@pytest.mark.parametrize("value", ["inter-node", 1, None.__class__])
def test_scope_must_be_a_known_name(value):
    with pytest.raises(ValueError, match="scope must be 'all' or 'inter_node'"):
        fp8comm.Options(scope=value)


def test_fp8_dtype_is_a_deprecated_spelling_of_wire_format():
    with pytest.warns(DeprecationWarning, match="use wire_format='e5m2'"):
        assert fp8comm.Options(fp8_dtype=torch.float8_e5m2).wire_format == "e5m2"
    with pytest.warns(DeprecationWarning):
        assert fp8comm.Options(fp8_dtype="e4m3").resolved().fp8_dtype == "e4m3"
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="disagree; give wire_format alone"):
        fp8comm.Options(fp8_dtype="e4m3", wire_format="mxfp4")
    with pytest.raises(ValueError, match="fp8_dtype must be"):
        fp8comm.Options(fp8_dtype="mxfp4")  # 4 bits are not an FP8 dtype: wire_format names them
    with pytest.raises(ValueError, match=re.escape(f"wire_format must be {choices(WIRE_FORMATS)}, got 'int4'")):
        fp8comm.Options(wire_format="int4")


def test_the_deprecated_environment_variable_is_read_when_the_new_one_is_unset(monkeypatch):
    monkeypatch.delenv("FP8COMM_WIRE_FORMAT", raising=False)
    monkeypatch.setenv("FP8COMM_FP8_DTYPE", "e5m2")
    assert fp8comm.Options().resolved().wire_format == "e5m2"
    monkeypatch.setenv("FP8COMM_WIRE_FORMAT", "mxfp4")
    assert fp8comm.Options().resolved().wire_format == "mxfp4"
    monkeypatch.setenv("FP8COMM_WIRE_FORMAT", "int4")
    with pytest.raises(ValueError, match="wire_format must be .* got 'int4' \\(from FP8COMM_WIRE_FORMAT\\)"):
        fp8comm.Options().resolved()


@pytest.mark.parametrize("value", [1.5, "16", True])
def test_block_size_must_be_an_int(value):
    with pytest.raises(ValueError, match="block_size must be"):
        fp8comm.Options(block_size=value)


def test_unset_compress_from_environment_none(monkeypatch):
    monkeypatch.setenv("FP8COMM_COMPRESS", "none")
    assert fp8comm.Options().resolved().compress == ()


def test_deepcopy_and_pickle_keep_every_field():
    """torch deep-copies a parent group's options when it splits the group."""
    opts = fp8comm.Options(block_size=64, wire_format="mxfp4", compress="all_gather", scope="inter_node",
                           rounding="stochastic", rounding_seed=3, node_wire_format="e4m3")
    for clone in (copy.deepcopy(opts), pickle.loads(pickle.dumps(opts))):
        assert clone == opts and clone is not opts
        assert clone.min_numel is None and clone.compress == ("all_gather",) and clone.scope == "inter_node"
        assert (clone.rounding, clone.rounding_seed, clone.node_wire_format) == ("stochastic", 3, "e4m3")
    assert "node_wire_format='e4m3'" in repr(opts)
    assert fp8comm.Options(node_wire_format="e4m3") != fp8comm.Options(node_wire_format="exact")
    assert fp8comm.Options(rounding="stochastic") != fp8comm.Options(rounding="nearest")
    assert fp8comm.Options(rounding_seed=1) != fp8comm.Options(rounding_seed=2)
    assert fp8comm.Options(scope="all") != fp8comm.Options(scope="inter_node")
    assert fp8comm.Options(block_size=64) != fp8comm.Options(block_size=32)


def test_the_readme_and_design_tables_are_the_rows():
    """The documents' tables are generated from the rows (fp8comm/options/);
    the assertion shows the text to paste."""
    readme, design = (ROOT / "README.md").read_text(), (ROOT / "DESIGN.md").read_text()
    assert environment_table() in readme, "README.md's environment variables table is not:\n" + environment_table()
    assert f"`pg_options={defaults_call()}`" in readme, "README.md's options row should show " + defaults_call()
    assert knob_table() in design, "DESIGN.md's \"Options\" table is not:\n" + knob_table()


def test_the_product_reads_no_undeclared_environment_variable():
    """Every FP8COMM_* name in the product's sources is a declared variable,
    a build switch (setup.py, build_config.py) or the CUDA build macro."""
    declared = {name for name, _, _ in environment_variables()}
    build_time = {"FP8COMM_FORCE_CPU", "FP8COMM_WITH_CUDA"}
    sources = [p for d in ("csrc", "fp8comm") for p in (ROOT / d).rglob("*")
               if p.suffix in {".py", ".h", ".cpp", ".cu", ".cuh"}]
    found = {}
    for path in sources:
        for name in re.findall(r"\bFP8COMM_[A-Z0-9_]+\b", path.read_text()):
            found.setdefault(name, path.relative_to(ROOT))
    unknown = {n: str(p) for n, p in found.items() if n not in declared | build_time}
    assert not unknown, f"undeclared FP8COMM_* variables (declare them in csrc/common/env.h): {unknown}"
    assert declared <= set(found), declared - set(found)


def test_each_variable_is_read_through_its_declaration_only():
    """The readers in csrc/common/env.h are the only place a variable's value
    and default are interpreted: no source reads an FP8COMM_* variable itself."""
    sources = [p for d in ("csrc", "fp8comm") for p in (ROOT / d).rglob("*")
               if p.suffix in {".py", ".h", ".cpp", ".cu", ".cuh"} and p.name != "env.h"]
    # a literal name, or a constant holding one (FUSED_CAST_ENV)
    direct = re.compile(r"""(getenv|environ\.get|environ\[)\(?\s*(["']FP8COMM_|[A-Z_]+_ENV\b)""")
    readers = {str(p.relative_to(ROOT)) for p in sources if direct.search(p.read_text())}
    assert not readers, f"read FP8COMM_* variables through csrc/common/env.h's readers instead: {readers}"


def test_typed_readers(monkeypatch):
    monkeypatch.delenv("FP8COMM_FUSED_CAST", raising=False)
    assert fp8comm._C.env_flag("FP8COMM_FUSED_CAST") is True  # its declared default
    monkeypatch.setenv("FP8COMM_FUSED_CAST", "0")
    assert fp8comm._C.env_flag("FP8COMM_FUSED_CAST") is False
    monkeypatch.setenv("FP8COMM_FUSED_CAST", "yes")
    with pytest.raises(ValueError, match="FP8COMM_FUSED_CAST must be 0 \\(off\\) or 1 \\(on\\), got 'yes'"):
        fp8comm._C.env_flag("FP8COMM_FUSED_CAST")
    monkeypatch.delenv("FP8COMM_LOCAL_SIZE", raising=False)
    assert fp8comm._C.env_positive_int("FP8COMM_LOCAL_SIZE") is None
    monkeypatch.setenv("FP8COMM_LOCAL_SIZE", "4")
    assert fp8comm._C.env_positive_int("FP8COMM_LOCAL_SIZE") == 4
    for bad in ("0", "-2", "two", "2.5"):
        monkeypatch.setenv("FP8COMM_LOCAL_SIZE", bad)
        with pytest.raises(ValueError, match=f"FP8COMM_LOCAL_SIZE must be a positive integer, got '{re.escape(bad)}'"):
            fp8comm._C.env_positive_int("FP8COMM_LOCAL_SIZE")
    with pytest.raises(ValueError, match="FP8COMM_NOPE is not an FP8COMM_\\* variable"):
        fp8comm._C.env_flag("FP8COMM_NOPE")


def test_cuda_codec_choice(monkeypatch):
    """FP8COMM_CUDA_CODEC names the CUDA codec's kernel set, read at every call."""
    monkeypatch.delenv("FP8COMM_CUDA_CODEC", raising=False)
    assert fp8comm._C.cuda_codec() == "legacy"
    monkeypatch.setenv("FP8COMM_CUDA_CODEC", "tiled")
    assert fp8comm._C.cuda_codec() == "tiled"
    monkeypatch.setenv("FP8COMM_CUDA_CODEC", "fast")
    with pytest.raises(ValueError, match="FP8COMM_CUDA_CODEC must be 'legacy' or 'tiled', got 'fast'"):
        fp8comm._C.cuda_codec()


def test_node_name_from_local_size_then_torchrun_then_host(monkeypatch):
    from fp8comm.topology import node_name

    monkeypatch.setenv("FP8COMM_LOCAL_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert node_name(5) == "ranks 4-5"
    monkeypatch.delenv("FP8COMM_LOCAL_SIZE")
    assert node_name(5) == "ranks 4-7"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "x")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='x' must be a positive integer"):
        node_name(5)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert node_name(5).startswith("host ")


# A value other than the default for every knob: a new knob adds its own here.
SAMPLE = {"block_size": 64, "wire_format": "mxfp4", "min_numel": 5, "compress": ("all_gather",), "cpu_threads": 3,
          "scope": "inter_node", "node_wire_format": "e4m3", "rounding": "stochastic", "rounding_seed": 9,
          "track_error": True}


def _clear_variables(monkeypatch):
    for name, _, _ in environment_variables():
        monkeypatch.delenv(name, raising=False)


def test_every_knob_has_a_sample_value():
    assert list(SAMPLE) == [row["name"] for row in ROWS]


def test_every_knob_is_a_keyword_a_property_a_repr_field_and_a_doc_entry(monkeypatch):
    _clear_variables(monkeypatch)
    unset, given, resolved = fp8comm.Options(), fp8comm.Options(**SAMPLE), fp8comm.Options().resolved()
    for row in ROWS:
        name = row["name"]
        assert getattr(unset, name) is None and f"{name}=None" in repr(unset)
        assert getattr(given, name) == SAMPLE[name] and f"{name}={SAMPLE[name]!r}" in repr(given)
        assert getattr(resolved, name) == row["default"], name
        assert f"\n{name}: {row['doc']}. Takes " in " ".join(fp8comm.Options.__doc__.split("\n    ")), name


def test_the_fingerprint_holds_the_knobs_the_ranks_agree_on():
    r = fp8comm.Options(**SAMPLE).resolved()
    assert set(r.fingerprint()) == {row["name"] for row in ROWS if not row["per_rank"]}


def test_pickle_and_equality_cover_every_knob():
    opts = fp8comm.Options(**SAMPLE)
    assert pickle.loads(pickle.dumps(opts)) == opts
    for name in SAMPLE:
        assert fp8comm.Options(**{name: SAMPLE[name]}) != fp8comm.Options(), name
        assert pickle.loads(pickle.dumps(fp8comm.Options(**{name: SAMPLE[name]}))) == fp8comm.Options(
            **{name: SAMPLE[name]}), name


def test_options_take_keywords_only_and_name_an_unknown_one():
    with pytest.raises(TypeError, match="keyword arguments only"):
        fp8comm.Options(32)
    with pytest.raises(TypeError, match="unknown option 'blocksize'; the options are block_size, "):
        fp8comm.Options(blocksize=32)


def test_wire_format_choices_are_the_wire_format_table():
    takes = {row["name"]: row["takes"] for row in ROWS}
    assert takes["wire_format"] == choices(WIRE_FORMATS)
    assert takes["node_wire_format"] == choices(["exact"] + WIRE_FORMATS)
    docs = {name: doc for name, _, doc in environment_variables()}
    assert docs["FP8COMM_WIRE_FORMAT"].startswith(f"Options.wire_format ({choices(WIRE_FORMATS)}):")
    for name in WIRE_FORMATS:
        r = fp8comm.Options(wire_format=name.upper(), node_wire_format=name, scope="inter_node").resolved()
        assert (r.wire_format, r.node_wire_format) == (name, name)


@pytest.mark.parametrize("row", ROWS, ids=[row["name"] for row in ROWS])
def test_a_bad_variable_names_the_knob_and_the_variable(monkeypatch, row):
    if row["takes_variable"] == "an int":
        bad = "x"
    else:
        bad = "-1" if row["takes_variable"].startswith("an int") or "multiple" in row["takes_variable"] else "bogus"
    monkeypatch.setenv(row["variable"], bad)
    expected = f"fp8comm.Options: {row['name']} must be {row['takes_variable']}, got '{bad}' (from {row['variable']})"
    with pytest.raises(ValueError, match=re.escape(expected)):
        fp8comm.Options().resolved()


def test_the_mismatch_names_the_knob_its_variable_and_each_rank():
    a = fp8comm.Options(scope="all", min_numel=16384, block_size=32).resolved().fingerprint()
    b = dict(a, scope="inter_node", min_numel="7")
    message = fp8comm._C.fingerprint_mismatch([a, b], 0)
    assert "min_numel: rank 0 has 16384, rank 1 has 7 (FP8COMM_MIN_NUMEL)" in message
    assert "scope: rank 0 has 'all', rank 1 has 'inter_node' (FP8COMM_SCOPE)" in message
    assert "block_size" not in message and "same fp8comm.Options" in message
    assert fp8comm._C.fingerprint_mismatch([a, dict(a)], 1) is None


def test_an_unset_block_size_is_the_size_a_format_requires(monkeypatch):
    """NVFP4 has blocks of 16: an unset block_size takes it, a set one must be it,
    and a node format that requires one sets it for the hop's format too."""
    monkeypatch.delenv("FP8COMM_BLOCK_SIZE", raising=False)
    assert fp8comm.Options(wire_format="nvfp4").resolved().block_size == 16
    assert fp8comm.Options(wire_format="e4m3").resolved().block_size == 32
    both = fp8comm.Options(wire_format="mxfp4", scope="inter_node", node_wire_format="nvfp4").resolved()
    assert both.block_size == 16
    with pytest.raises(ValueError, match="wire_format 'nvfp4' has blocks of 16 elements, got block_size=32"):
        fp8comm.Options(wire_format="nvfp4", block_size=32).resolved()
    monkeypatch.setenv("FP8COMM_BLOCK_SIZE", "64")
    with pytest.raises(ValueError, match="has blocks of 16 elements, got block_size=64"):
        fp8comm.Options(wire_format="nvfp4").resolved()


def test_the_signature_names_every_knob_keyword_only_unset_by_default():
    import inspect

    params = inspect.signature(fp8comm.Options).parameters
    assert list(params) == [row["name"] for row in option_table()]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is None for p in params.values())
    kinds = {row["name"]: row["kind"] for row in option_table()}
    assert params["block_size"].annotation == "int | None" and kinds["track_error"] == "flag"
    assert "'nvfp4'" in params["wire_format"].annotation  # choices from the format table


def test_the_stub_is_the_rows():
    """fp8comm/_C.pyi is generated (`python -m fp8comm.options --write-docs`)."""
    from fp8comm.options import stub

    assert (ROOT / "fp8comm" / "_C.pyi").read_text() == stub(), "run `python -m fp8comm.options --write-docs`"


def test_write_docs_restores_the_tables_and_then_changes_nothing(tmp_path):
    from fp8comm.options import write_docs

    (tmp_path / "fp8comm").mkdir()
    readme = (ROOT / "README.md").read_text()
    design = (ROOT / "DESIGN.md").read_text()
    # A stale table: its last row dropped, a default changed.
    stale_env = environment_table().rsplit("\n", 1)[0]
    (tmp_path / "README.md").write_text(readme.replace(environment_table(), stale_env).replace(
        defaults_call(), defaults_call().replace("block_size=32", "block_size=64")))
    (tmp_path / "DESIGN.md").write_text(design.replace(knob_table(), knob_table().rsplit("\n", 1)[0]))
    assert sorted(write_docs(tmp_path)) == ["DESIGN.md", "README.md", "fp8comm/_C.pyi"]
    assert (tmp_path / "README.md").read_text() == readme
    assert (tmp_path / "DESIGN.md").read_text() == design
    assert write_docs(tmp_path) == []
