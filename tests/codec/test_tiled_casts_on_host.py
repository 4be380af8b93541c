"""The tiled fused casts (csrc/linear/cast_cuda_tiled.cu, FP8COMM_CUDA_CAST=tiled)
run on the host under the SIMT emulator, beyond the cases
test_kernels_on_host.py runs on both cast sets: which kernels each recipe
launches (tensorwise: no clearing launch, one amax pass and one cast pass;
the rows that go to cast_cuda.cu's kernels named), rows held in registers at
every size class, grids that loop over tiles cut by the matrix's edges, and
products that land on every rounding midpoint and on the saturation bound,
all equal to the CPU twin bit for bit; and the delayed recipe's one-pass
cast (a given scale, this x's amax recorded in the same pass) equal to
fp8comm/nn/delayed.py's torch ops."""
import math

import pytest
import torch

from tests.codec.test_kernels_on_host import (  # noqa: F401 (fixtures)
    CAST_FORMAT, E4M3, E5M2, ELEM, FILL, GUARD, cast_both, embed, filled, kernels_launched, lib, lib_path, name,
    wide)

TENSORWISE, ROWWISE = False, True
ALL_MODES = [(True, False), (True, True), (False, True)]
PI32 = torch.tensor(math.pi).item()  # what scaled_cast's inverses hold until written


def launches(lib, x, fp8, rowwise, with_data, with_t, amax=None):
    lib.simt_take_launches()
    cast_both(lib, x, fp8, rowwise, with_data, with_t, 1, 2, amax, cast_set="tiled")
    return kernels_launched(lib)


@pytest.mark.fast
def test_which_kernels_run(lib):
    """Tensorwise: every amax block writes its own partial (no clear), the
    cast pass reduces them; a given amax skips the amax pass. Rowwise rows:
    one kernel (the row read once); with the transpose: the row and column
    amaxes, then the tile pass. A row of more than 1024 x 8 runs of 16 bytes
    goes to cast_cuda.cu's row kernel."""
    gen = torch.Generator().manual_seed(3)
    x = wide((70, 90), torch.float32, gen)
    assert launches(lib, x, E4M3, TENSORWISE, True, False) == ["amax_partials_kernel", "cast_flat_tiles_kernel"]
    assert launches(lib, x, E4M3, TENSORWISE, True, True) == ["amax_partials_kernel", "cast_transpose_tiles_kernel"]
    amax = torch.tensor([5.0])
    assert launches(lib, x, E5M2, TENSORWISE, False, True, amax) == ["cast_transpose_tiles_kernel"]
    assert launches(lib, x, E5M2, TENSORWISE, True, False, amax) == ["cast_flat_tiles_kernel"]
    assert launches(lib, x, E4M3, ROWWISE, True, False) == ["cast_rows_in_registers_kernel"]
    assert launches(lib, x, E4M3, ROWWISE, True, True) == ["amax_rows_cols_kernel", "cast_transpose_tiles_kernel"]
    long_row = wide((1, 8192 * 4 + 3), torch.float32, gen)
    assert launches(lib, long_row, E4M3, ROWWISE, True, False) == ["cast_rows_kernel"]  # cast_cuda.cu's


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=name)
@pytest.mark.parametrize("cols", [1, 7, 4096 * 4 + 5, 4096 * 8 - 3])
def test_rows_in_registers(lib, dtype, cols):
    """Rows of one run to 1024 threads x 8 runs (the 4-run and 8-run kernels,
    a partial last run), more rows than the emulated grid has blocks."""
    gen = torch.Generator().manual_seed(cols)
    rows = 5 if cols < 100 else 2
    x = wide((rows, cols), dtype, gen)
    x.view(-1)[cols // 2] = math.nan if cols > 1 else 0.0
    cast_both(lib, x, E4M3, ROWWISE, True, False, 3, 1, cast_set="tiled")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=name)
@pytest.mark.parametrize("rowwise", [TENSORWISE, ROWWISE], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("shape", [(64, 128), (193, 257), (130, 517)])
def test_tiles_at_the_edges(lib, dtype, rowwise, shape):
    """Tiles of 64 rows x 64 (FP32) or 128 (16-bit) columns, the last ones
    cut by the matrix's edges, more tiles than the emulated grid's 3 blocks."""
    gen = torch.Generator().manual_seed(shape[0] * shape[1])
    x = wide(shape, dtype, gen)
    for with_data, with_t in ALL_MODES:
        cast_both(lib, x, E5M2, rowwise, with_data, with_t, 0, 3, cast_set="tiled")


def midpoints_and_bounds(fp8):
    """Every FP8 value, every midpoint between neighbours (the ties of the
    rounding), the saturation bound fp8_max + half a step, each with its
    float32 neighbours, both signs, zeros and non-finite values."""
    codes = torch.arange(0, 128, dtype=torch.uint8).view(fp8).float()
    values = codes[torch.isfinite(codes)].unique()
    mids = (values[1:] + values[:-1]) / 2
    top = values[-1]
    step = top - values[-2]
    base = torch.cat([values, mids, torch.tensor([top + step / 2, top + step, 3.0e38])])
    up, down = torch.nextafter(base, torch.tensor(math.inf)), torch.nextafter(base, torch.tensor(-math.inf))
    v = torch.cat([base, up, down])
    return torch.cat([v, -v, torch.tensor([math.inf, -math.inf, -0.0])])


@pytest.mark.parametrize("fp8", [E4M3, E5M2], ids=name)
@pytest.mark.parametrize("amax_kind", ["fp8_max", "pow2", "pow2_up", "pow2_down"])
def test_rounding_midpoints_and_scale_boundaries(lib, fp8, amax_kind):
    """Tensorwise with a given amax at fp8_max, at fp8_max x 2^-3 (an exact
    power-of-two scale) and one float32 ulp either side: products on every
    rounding midpoint and the saturation bound; the transposed layout from the
    same codes."""
    fp8_max = torch.finfo(fp8).max
    amax = torch.tensor([fp8_max if amax_kind == "fp8_max" else fp8_max / 8], dtype=torch.float32)
    if amax_kind != "fp8_max" and amax_kind != "pow2":
        amax = torch.nextafter(amax, torch.tensor(math.inf if amax_kind == "pow2_up" else 0.0))
    scale = (1.0 / amax) * fp8_max  # the twin's float32 scale (cast_math.h)
    v = midpoints_and_bounds(fp8) / scale
    n = v.numel()
    cols = 61
    x = torch.cat([v, torch.zeros((-n) % cols)]).view(-1, cols)
    for with_data, with_t in ALL_MODES:
        cast_both(lib, x, fp8, TENSORWISE, with_data, with_t, 2, 1, amax, cast_set="tiled")


@pytest.mark.parametrize("fp8", [E4M3, E5M2], ids=name)
def test_rowwise_scale_boundaries(lib, fp8):
    """Rowwise: each row's own amax is the format's largest value times a power
    of two, or one ulp either side, so that row's scale is exact or just off
    it; the columns see the transposed mix."""
    fp8_max = torch.finfo(fp8).max
    v = midpoints_and_bounds(fp8)
    v = v[torch.isfinite(v)][:96]
    rows = []
    for k, e in enumerate(range(-6, 6)):
        top = torch.tensor([fp8_max * 2.0 ** e])
        top = [top, torch.nextafter(top, torch.tensor(math.inf)), torch.nextafter(top, torch.tensor(0.0))][k % 3]
        row = v / v.abs().amax() * top * 0.999
        row[k] = top[0] * (-1) ** k
        rows.append(row)
    x = torch.stack(rows)
    for with_data, with_t in ALL_MODES:
        cast_both(lib, x, fp8, ROWWISE, with_data, with_t, 1, 0, cast_set="tiled")


def scaled_cast(lib, x, fp8, scale, with_data, with_t, offset=1, outer=None):
    """The tiled kernels' cast of x (a view `offset` elements from a 16-byte
    boundary) with a given scale: (data, inv, data_t, inv_t, amax, kernels
    launched); outputs not asked for are None, inverses not asked for stay pi.
    `outer` (a list) gets the filled buffers around data and data_t."""
    M, K = x.shape
    xs = embed(x.flatten(), offset)
    data_outer, data = filled(M * K, torch.uint8, offset) if with_data else (None, None)
    t_outer, data_t = filled(M * K, torch.uint8, offset) if with_t else (None, None)
    if outer is not None:
        outer += [data_outer, t_outer]
    inv, inv_t, amax = (torch.full((1,), math.pi) for _ in range(3))
    scale_t = torch.tensor([scale], dtype=torch.float32)
    workspace = torch.randint(-(1 << 31), 1 << 31, (lib.simt_cast_workspace_words(M, K, 0),), dtype=torch.int32)
    lib.simt_take_launches()
    rc = lib.simt_tiled_cast_scaled(xs.data_ptr(), ELEM[x.dtype], M, K, CAST_FORMAT[fp8],
                                    data.data_ptr() if with_data else None, inv.data_ptr() if with_data else None,
                                    data_t.data_ptr() if with_t else None, inv_t.data_ptr() if with_t else None,
                                    scale_t.data_ptr(), amax.data_ptr(), workspace.data_ptr())
    assert rc == 0
    return data, inv, data_t, inv_t, amax, kernels_launched(lib)


def canonical_codes(codes):
    """FP8 codes with every NaN as 0x7F (what both our paths write; torch's
    eager cast on the CPU keeps the NaN's sign)."""
    return torch.where(codes.float().isnan(), torch.tensor(0x7F, dtype=torch.uint8), codes.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=name)
@pytest.mark.parametrize("fp8", [E4M3, E5M2], ids=name)
@pytest.mark.parametrize("special", ["finite", "inf", "nan"])
def test_delayed_cast_records_the_amax_in_the_same_pass(lib, dtype, fp8, special):
    """A given scale (from an amax history: smaller than the tensor's own, so
    that it saturates; larger; a power of two; 0) gives delayed.py's
    cast_with_scale bytes, 1 / scale, and this x's amax, NaN included, from
    one pass over x (the cast kernel and a one-block reduction of its
    partials), with and without the transpose."""
    from fp8comm.nn.delayed import cast_with_scale

    gen = torch.Generator().manual_seed(11)
    x = wide((130, 200), dtype, gen)
    if special != "finite":
        x[7, 9] = math.inf if special == "inf" else math.nan
    own = x.float().abs().amax()
    fp8_max = torch.finfo(fp8).max
    for k, scale in enumerate([fp8_max / own.item() * 4, fp8_max / own.item() / 3, 2.0 ** -7, 0.0]):
        scale = torch.tensor(scale, dtype=torch.float32)
        want, want_inv, want_amax, _ = cast_with_scale(x, fp8, scale)
        if want_inv.isnan():  # a NaN scale's inverse: the canonical NaN (cast_math.h's given_scale), as on CUDA
            want_inv = torch.tensor([0x7FFFFFFF], dtype=torch.int32).view(torch.float32).reshape(())
        for with_data, with_t in ALL_MODES:
            data, inv, data_t, inv_t, amax, launched = scaled_cast(lib, x, fp8, scale.item(), with_data, with_t)
            assert launched == ["cast_transpose_tiles_kernel" if with_t else "cast_flat_tiles_kernel",
                                "reduce_partials_kernel"]
            if with_data:
                assert torch.equal(data, canonical_codes(want).flatten()), (k, "data")
                assert torch.equal(inv.view(torch.int32), want_inv.reshape(1).view(torch.int32)), (k, "inv")
            if with_t:
                assert torch.equal(data_t, canonical_codes(want).t().contiguous().flatten()), (k, "data_t")
                assert torch.equal(inv_t.view(torch.int32), want_inv.reshape(1).view(torch.int32)), (k, "inv_t")
            if special == "nan":
                assert amax.isnan().all(), k
            else:
                assert torch.equal(amax.view(torch.int32), want_amax.reshape(1).view(torch.int32)), (k, "amax")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=name)
@pytest.mark.parametrize("offset", [0, 3])
@pytest.mark.parametrize("shape", [(1, 7), (64, 128), (131, 517)])
def test_delayed_cast_equals_the_cpu_twin(lib, dtype, offset, shape):
    """The given-scale cast against the CPU twin's operator
    (fp8comm::cast_fp8_scaled) bit for bit, codes, inverses and amax, with a
    NaN and an Inf planted: sources 16-byte aligned and not, every dtype,
    tiles cut by the edges over a looping grid; nothing written outside the
    outputs asked for, an inverse not asked for left alone."""
    gen = torch.Generator().manual_seed(shape[0] * 7 + offset)
    x = wide(shape, dtype, gen)
    x.view(-1)[shape[1] // 2] = math.nan
    x.view(-1)[-1] = -math.inf
    finite = x.float()[torch.isfinite(x.float())].abs().amax()
    for k, fp8 in enumerate((E4M3, E5M2)):
        scale = torch.tensor(torch.finfo(fp8).max / finite.item() * (4.0 if k else 0.25), dtype=torch.float32)
        for with_data, with_t in ALL_MODES:
            outer = []
            data, inv, data_t, inv_t, amax, _ = scaled_cast(lib, x, fp8, scale.item(), with_data, with_t, offset,
                                                            outer)
            want = torch.ops.fp8comm.cast_fp8_scaled(x, fp8, scale, with_data, with_t)
            where = (fp8, with_data, with_t)
            if with_data:
                assert torch.equal(data, want[0].view(torch.uint8).flatten()), where
                assert torch.equal(inv.view(torch.int32), want[1].reshape(1).view(torch.int32)), where
            else:
                assert inv.item() == PI32, where
            if with_t:
                assert torch.equal(data_t, want[2].view(torch.uint8).flatten()), where
                assert torch.equal(inv_t.view(torch.int32), want[3].reshape(1).view(torch.int32)), where
            else:
                assert inv_t.item() == PI32, where
            assert amax.isnan().all() and want[4].isnan(), where  # x holds a NaN: so does its amax
            for buf in filter(lambda b: b is not None, outer):
                start, n = GUARD + offset, x.numel()
                assert bool((buf[:start] == FILL).all()) and bool((buf[start + n:] == FILL).all()), where
