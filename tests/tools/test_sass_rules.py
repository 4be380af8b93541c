"""The static SASS rules (tests/tools/sass, CI's `.ci/sass_check`): the parsers
on ptxas / nvdisasm text captured from tests/tools/sass/fixtures/probe.cu, each
rule firing on the kernel planted to break it, and the real checker finding a
64-bit division and a compiler warning in planted sources.
"""
import os
import shutil

import pytest

from tests.tools.sass import check, parse, rules

FIXTURES = os.path.join(os.path.dirname(__file__), "sass", "fixtures")


@pytest.fixture(scope="module")
def probe():
    """The probe's kernels (sm_90) by name."""
    functions = {}
    with open(os.path.join(FIXTURES, "probe_sm90.ptxas.txt")) as f:
        parse.parse_ptxas(f.read(), functions)
    with open(os.path.join(FIXTURES, "probe_sm90.sass.txt")) as f:
        parse.parse_sass(f.read(), functions)
    return {parse.base_name(parse.demangle(fn.mangled)): fn for fn in functions.values()}


def test_parsers_read_every_fact_of_the_probe(probe):
    assert sorted(probe) == ["dequant_sum_clean", "dequantize_narrow", "quantize_div64", "quantize_spills",
                             "quantize_wide_regs"]
    assert all(fn.entry for fn in probe.values())
    clean = probe["dequant_sum_clean"]
    assert (clean.registers, clean.div64_calls, clean.wide_loads(), clean.wide_stores()) == (14, 0, 1, 1)
    div = probe["quantize_div64"]
    assert div.div64_calls == 2  # one __cuda_sm20_div_s64, one __cuda_sm20_rem_s64
    assert (div.loads[64], div.stores[64]) == (2, 2)
    assert probe["quantize_wide_regs"].registers == 96
    spills = probe["quantize_spills"]
    assert (spills.stack_frame, spills.spill_stores, spills.spill_loads) == (72, 84, 108)
    narrow = probe["dequantize_narrow"]
    assert (narrow.loads[32], narrow.stores[32], narrow.wide_loads(), narrow.wide_stores()) == (1, 1, 0, 0)


@pytest.mark.parametrize("kernel, fired", [
    ("dequant_sum_clean", []),
    ("quantize_div64", ["div64"]),
    ("quantize_wide_regs", ["registers"]),
    ("quantize_spills", ["local-memory"]),
    ("dequantize_narrow", ["store128"]),
])
def test_each_rule_fires_on_the_kernel_that_breaks_it(probe, kernel, fired):
    found = rules.violations("csrc/codec/probe.cu", kernel, probe[kernel])
    assert [rule for rule, _ in found] == fired
    assert all(why for _, why in found)


def test_a_kernel_reading_elements_needs_a_128_bit_load(probe):
    found = rules.violations("csrc/codec/probe.cu", "quantize_narrow", probe["dequantize_narrow"])
    assert [rule for rule, _ in found] == ["load128"]


def test_the_register_ceiling_holds_codec_kernels_only(probe):
    assert rules.violations("csrc/linear/probe.cu", "quantize_wide_regs", probe["quantize_wide_regs"]) == []


@pytest.mark.parametrize("name, path", [
    ("clear_segment_amax_kernel", (False, False)),
    ("segment_scale_kernel", (False, False)),
    ("segment_amax_kernel", (True, False)),
    ("quantize_tiled_kernel", (True, False)),
    ("cast_tile_kernel", (True, False)),
    ("dequantize_tiled_kernel", (False, True)),
    ("dequant_sum_tiled_kernel", (True, True)),
])
def test_element_paths_by_kernel_name(name, path):
    assert rules.element_path(name) == path


def test_only_todays_kernels_are_exempt():
    assert rules.exemption("csrc/codec/codec_cuda.cu", "quantize_warp_kernel") == rules.LEGACY_REASON
    assert rules.exemption("csrc/linear/cast_cuda.cu", "cast_tile_kernel") == rules.LEGACY_REASON
    assert rules.exemption("csrc/codec/codec_cuda.cu", "quantize_tiled_kernel") is None
    assert rules.exemption("csrc/codec/codec_cuda_tiled.cu", "quantize_warp_kernel") is None


@pytest.mark.parametrize("opcode, bits", [
    ("LDG.E.128.CONSTANT", 128), ("STG.E.128", 128), ("LDG.E.ENL2.256.CONSTANT", 256), ("LDG.E.64", 64),
    ("LDG.E", 32), ("LDG.E.U16.CONSTANT", 16), ("STG.E.U8", 8),
])
def test_access_width_from_the_opcode(opcode, bits):
    assert parse.access_bits(opcode) == bits


def test_hardware_conversions_are_counted():
    # Lines of nvdisasm's output for __nv_cvt_float2_to_fp8x2, __nv_cvt_fp8x2_to_halfraw2 and
    # __float22bfloat162_rn (sm_90), in a function section; F2F.F64.F32 is no FP8 conversion.
    text = "\n".join([
        "\t.section\t.text._Z3encv,\"ax\",@progbits",
        "        /*0100*/                   F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C R9, R3, R2, RZ ;",
        "        /*0110*/               @P0 F2FP.F16.E5M2.UNPACK_B R4, R9 ;",
        "        /*0120*/                   F2FP.BF16.F32.PACK_AB R5, R3, R2 ;",
        "        /*0130*/                   F2F.F64.F32 R6, R2 ;",
    ])
    fn = parse.parse_sass(text)["_Z3encv"]
    assert (fn.fp8_conversions, fn.bf16_conversions) == (2, 1)


def test_fp32_division_calls_are_reported_apart_from_64_bit_ones():
    text = "\n".join([
        "\t.section\t.text._Z3divv,\"ax\",@progbits",
        "        /*0100*/                   CALL.REL.NOINC `($__internal_0_$__cuda_sm3x_div_rn_noftz_f32_slowpath) ;",
        "        /*0110*/              @!P0 CALL.REL.NOINC `($__internal_1_$__cuda_sm20_rem_u64) ;",
    ])
    fn = parse.parse_sass(text)["_Z3divv"]
    assert (fn.fdiv32_calls, fn.div64_calls) == (1, 1)


def test_names_of_template_kernels():
    demangled = ("void fp8comm::(anonymous namespace)::quantize_warp_kernel<fp8comm::(anonymous namespace)::"
                 "PiecesSource<(fp8comm::ElemType)2, (fp8comm::WireFormat)3>, (fp8comm::WireFormat)3>"
                 "(fp8comm::(anonymous namespace)::PiecesSource<(fp8comm::ElemType)2, (fp8comm::WireFormat)3>, "
                 "fp8comm::BlockCodes, long)")
    assert parse.base_name(demangled) == "quantize_warp_kernel"
    enums = {("ElemType", "2"): "F16", ("WireFormat", "3"): "NVFP4"}
    assert check.short_name(demangled, enums) == "quantize_warp_kernel<PiecesSource<F16, NVFP4>, NVFP4>"
    assert parse.demangle("_Z14quantize_div64PKlPlll") == "quantize_div64(long const*, long*, long, long)"


def test_the_checker_finds_a_planted_64_bit_division_and_a_warning(tmp_path, capsys):
    if not shutil.which("nvcc"):
        pytest.skip("nvcc not found: the checker compiles with it (CI's checks stage runs it where nvcc is)")
    if check.find_nvdisasm() is None:
        pytest.skip(f"nvdisasm not found: {check.PIP_LINE}")
    source = tmp_path / "planted.cu"
    source.write_text(
        "#include <stdint.h>\n"
        "__global__ void quantize_planted(const float4* a, float4* b, int64_t n, int64_t d) {\n"
        "  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;\n"
        "  if (i < n) b[i / d] = a[i];\n"
        "}\n"
        "__global__ void quantize_clean(const float4* a, float4* b, int n) {\n"
        "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "  if (i < n) b[i] = a[i];\n"
        "}\n")
    warned = tmp_path / "warned.cu"
    warned.write_text("__global__ void quantize_warned(float4* a) { int unused = 3; a[threadIdx.x] = a[0]; }\n")
    assert check.main(["--arch", "sm_90", str(source), str(warned)]) == 1
    out = capsys.readouterr().out
    failures = [line for line in out.splitlines() if line.startswith("sass_check: ") and ".cu" in line]
    assert len(failures) == 2, out
    assert "planted.cu" in failures[0] and "quantize_planted" in failures[0] and "64-bit integer division" in failures[0]
    assert "warned.cu" in failures[1] and "did not compile" in failures[1]
    assert 'variable "unused" was declared but never referenced' in out
