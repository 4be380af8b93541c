// The codec as torch.library operators (namespace fp8comm), registered for the
// CPU and CUDA dispatch keys; their fake implementations live in
// fp8comm/codec.py. Arguments are checked here, where they enter, and errors
// name the operator and the argument.
#include <torch/library.h>

#include "codec_tensor.h"

namespace fp8comm {
namespace {

BlockCodes flat_codes(const at::Tensor& scales, const at::Tensor& codes, int64_t numel,
                      int64_t block_size, WireFormat format) {
  BlockCodes c;
  c.scales = static_cast<uint8_t*>(scales.data_ptr());
  c.codes = static_cast<uint8_t*>(codes.data_ptr());
  c.num_segments = 1;
  c.segment_numel = numel;
  c.capacity = numel;
  c.block_size = static_cast<int>(block_size);
  c.format = format;
  return c;
}

// The rounding of a quantizing operator: `rounding` by name, keyed by
// `rounding_key` (its 64 bits; rounding.h) when stochastic.
BlockCodes with_rounding(BlockCodes c, const char* op, const std::string& rounding, int64_t rounding_key) {
  TORCH_CHECK_VALUE(find_rounding(rounding, c.rounding), op, ": rounding must be 'nearest' or 'stochastic', got '",
                    rounding, "'");
  c.rounding_key = static_cast<uint64_t>(rounding_key);
  return c;
}

void check_wire(const char* op, const char* name, const at::Tensor& t, int64_t num_segments,
                int64_t segment_numel, int64_t block_size, WireFormat format, int64_t min_segments = 1) {
  TORCH_CHECK(num_segments >= min_segments && segment_numel >= 0, op, ": the number of segments must be >= ",
              min_segments, " and segment_numel >= 0, got ", num_segments, " and ", segment_numel);
  const int64_t expected = num_segments * segment_bytes(segment_numel, block_size, format);
  TORCH_CHECK(t.scalar_type() == at::kByte && t.is_contiguous() && t.numel() == expected, op, ": ",
              name, " must be a contiguous uint8 tensor of ", expected, " bytes (", num_segments,
              " segments of fp8comm.segment_bytes(", segment_numel, ", ", block_size, ", wire_format='",
              wire_format_name(format), "')), got ", t.scalar_type(), " with ", t.numel(), " elements");
}

void check_out(const char* op, const at::Tensor& out, const at::Tensor& like, int64_t max_numel) {
  TORCH_CHECK(out.device() == like.device(), op, ": out is on ", out.device(),
              " but the codes are on ", like.device(), "; put both on one device");
  TORCH_CHECK(out.is_contiguous(), op, ": out must be contiguous");
  TORCH_CHECK(out.numel() <= max_numel, op, ": out has ", out.numel(), " elements, more than the ",
              max_numel, " the segments hold");
  elem_type_of(out.scalar_type(), op);
}

// One buffer of [segment scale][block scales] (the segment scale's bytes
// only for a format that has one), as a flat BlockCodes reads them.
at::Tensor scale_buffer(int64_t blocks, WireFormat format, const at::TensorOptions& options) {
  return at::empty({segment_scale_bytes(format) + blocks}, options.dtype(at::kByte));
}

// (codes, block scales, segment scale): the segment scale is one float32
// for a format that has one, else empty.
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize(const at::Tensor& x, int64_t block_size,
                                                        const std::string& wire_format, const std::string& rounding,
                                                        int64_t rounding_key) {
  const char* op = "fp8comm.quantize";
  const WireFormat format = wire_format_of(wire_format, op);
  check_block_size(block_size, format, op);
  elem_type_of(x.scalar_type(), op);
  const at::Tensor src = x.contiguous();
  const int64_t n = src.numel();
  const int64_t per_code = 8 / code_bits(format);  // codes per tensor element
  const WireFormatRow& row = wire_format_row(format);
  at::Tensor codes = at::empty({ceil_div(n, per_code)}, src.options().dtype(row.codes_type));
  const int64_t head = segment_scale_bytes(format);
  at::Tensor buffer = scale_buffer(ceil_div(n, block_size), format, src.options());
  at::Tensor scales = buffer.narrow(0, head, buffer.numel() - head);
  BlockCodes dst = with_rounding(flat_codes(scales, codes, n, block_size, format), op, rounding, rounding_key);
  dst.scales = static_cast<uint8_t*>(buffer.data_ptr()) + head;  // an empty slice's data_ptr is null
  if (n > 0) {
    quantize_into(src, 1.0f, std::nullopt, dst);
  }
  at::Tensor segment_scale = head > 0 ? buffer.narrow(0, 0, head).view(at::kFloat) : src.new_empty({0}, at::kFloat);
  // No elements: the segment scale of a segment of zeros, written by a tensor
  // op since the buffer may be device memory.
  if (n == 0 && head > 0) segment_scale.fill_(1.0f);
  return {codes, scales.view(row.scales_type), segment_scale};
}

at::Tensor dequantize(const at::Tensor& codes, const at::Tensor& scales, const std::optional<at::Tensor>& segment_scale,
                      int64_t block_size, at::ScalarType dtype, int64_t numel, const std::string& wire_format) {
  const char* op = "fp8comm.dequantize";
  const WireFormat format = wire_format_of(wire_format, op);
  check_block_size(block_size, format, op);
  const WireFormatRow& row = wire_format_row(format);
  TORCH_CHECK_VALUE(codes.scalar_type() == row.codes_type, op, ": the codes of wire_format '", wire_format,
                    "' are ", row.codes_type, ", got ", codes.scalar_type());
  elem_type_of(dtype, op);
  const int64_t per_code = 8 / code_bits(format);
  const int64_t n = numel < 0 ? codes.numel() * per_code : numel;
  TORCH_CHECK(ceil_div(n, per_code) == codes.numel(), op, ": ", codes.numel(), " ", codes.scalar_type(),
              " elements hold ", codes.numel() * per_code, " codes, not numel=", numel,
              " (an odd count of 4-bit codes is given as numel)");
  TORCH_CHECK(scales.scalar_type() == row.scales_type || scales.scalar_type() == at::kByte, op,
              ": the scales of wire_format '", wire_format, "' must be ", row.scales_type, " or uint8, got ",
              scales.scalar_type());
  TORCH_CHECK(codes.device() == scales.device(), op, ": codes on ", codes.device(),
              " but scales on ", scales.device());
  TORCH_CHECK(scales.numel() == ceil_div(n, block_size), op, ": ", n, " codes in blocks of ",
              block_size, " need ", ceil_div(n, block_size), " scales, got ", scales.numel());
  const int64_t head = segment_scale_bytes(format);
  const bool has_segment_scale = segment_scale && segment_scale->numel() > 0;
  TORCH_CHECK_VALUE(has_segment_scale == (head > 0), op, ": wire_format '", wire_format, "' ",
                    head > 0 ? "needs the segment scale quantize returned third (one float32)"
                             : "has no segment scale; pass none");
  at::Tensor buffer = scale_buffer(scales.numel(), format, codes.options());
  if (head > 0) {
    TORCH_CHECK_VALUE(segment_scale->numel() == 1 && segment_scale->scalar_type() == at::kFloat, op,
                      ": segment_scale must be one float32, got ", segment_scale->numel(), " ",
                      segment_scale->scalar_type());
    buffer.narrow(0, 0, head).copy_(segment_scale->reshape({1}).view(at::kByte));
  }
  buffer.narrow(0, head, scales.numel()).copy_(scales.reshape({-1}).view(at::kByte));
  const at::Tensor c = codes.contiguous();
  at::Tensor out = at::empty({n}, codes.options().dtype(dtype));
  if (n > 0) dequantize_into(flat_codes(buffer.narrow(0, head, scales.numel()), c, n, block_size, format), out);
  return out;
}

void quantize_segments(const at::Tensor& x, const at::Tensor& out, int64_t num_segments,
                       int64_t segment_numel, int64_t block_size, const std::string& wire_format,
                       double premul, const std::optional<at::Tensor>& premul_tensor, const std::string& rounding,
                       int64_t rounding_key) {
  const char* op = "fp8comm.quantize_segments";
  const WireFormat format = wire_format_of(wire_format, op);
  check_block_size(block_size, format, op);
  check_wire(op, "out", out, num_segments, segment_numel, block_size, format);
  elem_type_of(x.scalar_type(), op);
  TORCH_CHECK(x.device() == out.device(), op, ": x on ", x.device(), " but out on ", out.device());
  TORCH_CHECK(x.numel() <= num_segments * segment_numel, op, ": x has ", x.numel(),
              " elements, more than ", num_segments, " segments of ", segment_numel);
  std::optional<at::Tensor> factor;
  if (premul_tensor) {
    TORCH_CHECK(premul_tensor->numel() == 1 && premul_tensor->device() == x.device(), op,
                ": premul_tensor must hold one element on ", x.device());
    factor = premul_tensor->to(at::kFloat).contiguous();
  }
  quantize_into(x.contiguous(), static_cast<float>(premul), factor,
                with_rounding(wire_segments(static_cast<uint8_t*>(out.data_ptr()), num_segments, segment_numel,
                                            static_cast<int>(block_size), format),
                              op, rounding, rounding_key));
}

void dequantize_segments(const at::Tensor& segments, const at::Tensor& out, int64_t num_segments,
                         int64_t segment_numel, int64_t block_size, const std::string& wire_format) {
  const char* op = "fp8comm.dequantize_segments";
  const WireFormat format = wire_format_of(wire_format, op);
  check_block_size(block_size, format, op);
  check_wire(op, "segments", segments, num_segments, segment_numel, block_size, format);
  check_out(op, out, segments, num_segments * segment_numel);
  dequantize_into(wire_segments(static_cast<uint8_t*>(segments.data_ptr()), num_segments,
                                segment_numel, static_cast<int>(block_size), format),
                  out);
}

void check_post_div(const char* op, int64_t post_div) {
  TORCH_CHECK(post_div >= 1, op, ": post_div must be >= 1, got ", post_div);
}

// The own addend of dequant_sum / dequant_sum_requantize: at most one piece's
// elements, on the pieces' device; with it, num_pieces may be 0.
OwnAddendTensor own_addend(const char* op, const std::optional<at::Tensor>& own, double own_premul,
                   const at::Tensor& pieces, int64_t segment_numel) {
  OwnAddendTensor in;
  in.premul = static_cast<float>(own_premul);
  if (!own) return in;
  elem_type_of(own->scalar_type(), op);
  TORCH_CHECK(own->device() == pieces.device(), op, ": own is on ", own->device(), " but the pieces are on ",
              pieces.device(), "; put both on one device");
  TORCH_CHECK(own->numel() <= segment_numel, op, ": own has ", own->numel(), " elements, more than the ",
              segment_numel, " of a piece");
  in.src = own->contiguous();
  return in;
}

void dequant_sum(const at::Tensor& pieces, const at::Tensor& out, int64_t num_pieces, int64_t segment_numel,
                 int64_t block_size, const std::string& wire_format, int64_t post_div, const std::optional<at::Tensor>& own,
                 double own_premul) {
  const char* op = "fp8comm.dequant_sum";
  check_post_div(op, post_div);
  const WireFormat format = wire_format_of(wire_format, op);
  check_block_size(block_size, format, op);
  check_wire(op, "pieces", pieces, num_pieces, segment_numel, block_size, format, own ? 0 : 1);
  check_out(op, out, pieces, segment_numel);
  TORCH_CHECK(!own || own->scalar_type() == out.scalar_type(), op, ": own is ", own ? own->scalar_type() : at::kFloat,
              " but out is ", out.scalar_type(), "; give both the same dtype");
  dequant_sum_into(wire_segments(static_cast<uint8_t*>(pieces.data_ptr()), num_pieces, segment_numel,
                                 static_cast<int>(block_size), format),
                   own_addend(op, own, own_premul, pieces, segment_numel), static_cast<int>(post_div), out);
}

void dequant_sum_requantize(const at::Tensor& pieces, const at::Tensor& out, int64_t num_pieces,
                            int64_t segment_numel, int64_t block_size, const std::string& wire_format, int64_t post_div,
                            const std::optional<at::Tensor>& own, double own_premul, const std::string& rounding,
                            int64_t rounding_key) {
  const char* op = "fp8comm.dequant_sum_requantize";
  check_post_div(op, post_div);
  const WireFormat format = wire_format_of(wire_format, op);
  check_block_size(block_size, format, op);
  check_wire(op, "pieces", pieces, num_pieces, segment_numel, block_size, format, own ? 0 : 1);
  check_wire(op, "out", out, 1, segment_numel, block_size, format);
  TORCH_CHECK(out.device() == pieces.device(), op, ": out on ", out.device(), " but pieces on ",
              pieces.device());
  const int block = static_cast<int>(block_size);
  dequant_sum_requantize_into(
      wire_segments(static_cast<uint8_t*>(pieces.data_ptr()), num_pieces, segment_numel, block, format),
      own_addend(op, own, own_premul, pieces, segment_numel), static_cast<int>(post_div),
      with_rounding(wire_segments(static_cast<uint8_t*>(out.data_ptr()), 1, segment_numel, block, format), op,
                    rounding, rounding_key),
      pieces.device());
}

}  // namespace

TORCH_LIBRARY(fp8comm, m) {
  m.def(
      "quantize(Tensor x, int block_size, str wire_format, str rounding=\"nearest\", int rounding_key=0) -> "
      "(Tensor codes, Tensor scales, Tensor segment_scale)");
  m.def(
      "dequantize(Tensor codes, Tensor scales, Tensor? segment_scale, int block_size, ScalarType dtype, "
      "int numel, str wire_format) -> Tensor");
  m.def(
      "quantize_segments(Tensor x, Tensor(a!) out, int num_segments, int segment_numel, "
      "int block_size, str wire_format, float premul=1.0, Tensor? premul_tensor=None, "
      "str rounding=\"nearest\", int rounding_key=0) -> ()");
  m.def(
      "dequantize_segments(Tensor segments, Tensor(a!) out, int num_segments, int segment_numel, "
      "int block_size, str wire_format) -> ()");
  m.def(
      "dequant_sum(Tensor pieces, Tensor(a!) out, int num_pieces, int segment_numel, "
      "int block_size, str wire_format, int post_div=1, Tensor? own=None, float own_premul=1.0) -> ()");
  m.def(
      "dequant_sum_requantize(Tensor pieces, Tensor(a!) out, int num_pieces, int segment_numel, "
      "int block_size, str wire_format, int post_div=1, Tensor? own=None, float own_premul=1.0, "
      "str rounding=\"nearest\", int rounding_key=0) -> ()");
}

#define FP8C_REGISTER_CODEC_IMPLS(m)                        \
  m.impl("quantize", &quantize);                            \
  m.impl("dequantize", &dequantize);                        \
  m.impl("quantize_segments", &quantize_segments);          \
  m.impl("dequantize_segments", &dequantize_segments);      \
  m.impl("dequant_sum", &dequant_sum);                      \
  m.impl("dequant_sum_requantize", &dequant_sum_requantize)

TORCH_LIBRARY_IMPL(fp8comm, CPU, m) { FP8C_REGISTER_CODEC_IMPLS(m); }
TORCH_LIBRARY_IMPL(fp8comm, CUDA, m) { FP8C_REGISTER_CODEC_IMPLS(m); }

}  // namespace fp8comm
