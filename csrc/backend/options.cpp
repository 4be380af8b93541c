#include "options.h"

#include <algorithm>

#include "../codec/codec_tensor.h"
#include "../common/env.h"

namespace fp8comm {

namespace {

std::string strip(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

}  // namespace

const char* scope_name(Scope scope) {
  switch (scope) {
    case Scope::kAll: return "all";
    case Scope::kInterNode: return "inter_node";
  }
  TORCH_CHECK(false, "fp8comm: unknown Scope ", static_cast<int>(scope));
}

std::optional<Scope> find_scope(const std::string& name) {
  for (Scope s : {Scope::kAll, Scope::kInterNode}) {
    if (name == scope_name(s)) return s;
  }
  return std::nullopt;
}

const std::vector<std::string>& Options::compressible_ops() {
  static const std::vector<std::string> ops = compressed::names();
  return ops;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(',', start), s.size());
    items.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return items;
}

std::vector<std::string> parse_compress(const std::vector<std::string>& raw, const std::string& where) {
  std::vector<std::string> items;
  for (const auto& s : raw) {
    if (!strip(s).empty()) items.push_back(strip(s));
  }
  const auto& all = Options::compressible_ops();
  if (items == std::vector<std::string>{"all"}) return all;
  if (items.empty() || items == std::vector<std::string>{"none"}) return {};
  std::string unknown;
  for (const auto& s : items) {
    if (std::find(all.begin(), all.end(), s) == all.end()) unknown += (unknown.empty() ? "'" : ", '") + s + "'";
  }
  std::string choices;
  for (const auto& op : all) choices += (choices.empty() ? "'" : ", '") + op + "'";
  TORCH_CHECK_VALUE(unknown.empty(), where, ": unknown op(s) [", unknown, "]; choose from [", choices,
                    "], 'all' or 'none'");
  std::vector<std::string> ops;
  for (const auto& op : all) {
    if (std::find(items.begin(), items.end(), op) != items.end()) ops.push_back(op);
  }
  return ops;
}

void check_node_wire_format(const std::string& name, const std::string& where) {
  TORCH_CHECK_VALUE(name == "exact" || find_wire_format(name), "fp8comm.Options: node_wire_format must be 'exact' or ",
                    wire_format_choices(), ", got '", name, "'", where);
}

namespace {

// block_size, once the formats are known: unset, the size a format in use
// requires (NVFP4's 16), else FP8COMM_BLOCK_SIZE's; every format in use
// must take it (one call's phases share one chunk plan).
void resolve_block_size(Options& r, bool given) {
  const std::optional<WireFormat> node = r.node_format();
  const int required = required_block_size(*r.wire_format) != 0 ? required_block_size(*r.wire_format)
                       : node                                  ? required_block_size(*node)
                                                               : 0;
  const bool from_env = !given && env::kBlockSize.read();
  if (!given && !from_env && required != 0) {
    r.block_size = required;
  } else if (!given) {
    r.block_size = env::kBlockSize.as_int();
  }
  const char* where = given ? "fp8comm.Options" : "fp8comm.Options (FP8COMM_BLOCK_SIZE)";
  check_block_size(*r.block_size, *r.wire_format, where);
  if (node) check_block_size(*r.block_size, *node, where);
}

}  // namespace

c10::intrusive_ptr<Options> Options::resolved() const {
  auto r = c10::make_intrusive<Options>(*this);
  if (!wire_format) {
    // FP8COMM_FP8_DTYPE: the deprecated spelling, read when FP8COMM_WIRE_FORMAT is unset.
    const bool old_name = !env::kWireFormat.read() && env::kFp8Dtype.read();
    const EnvVar& var = old_name ? env::kFp8Dtype : env::kWireFormat;
    const std::string name = old_name ? *env::kFp8Dtype.read() : env::kWireFormat.value_or_fallback();
    const auto found = find_wire_format(name);
    TORCH_CHECK_VALUE(found, "fp8comm.Options: wire_format must be ", wire_format_choices(), ", got '", name,
                      "' (from ", var.name, ")");
    if (old_name) {
      TORCH_WARN_ONCE("fp8comm: FP8COMM_FP8_DTYPE is deprecated; set FP8COMM_WIRE_FORMAT=", name, " instead");
    }
    r->wire_format = *found;
  }
  r->min_numel = min_numel ? *min_numel : env::kMinNumel.as_int();
  TORCH_CHECK_VALUE(*r->min_numel >= 0, "fp8comm.Options: min_numel must be an int >= 0, got ", *r->min_numel,
                    min_numel ? "" : " (from FP8COMM_MIN_NUMEL)");
  if (!cpu_threads && env::kCpuThreads.read()) r->cpu_threads = env::kCpuThreads.as_int();
  TORCH_CHECK_VALUE(!r->cpu_threads || *r->cpu_threads >= 1, "fp8comm.Options: cpu_threads must be an int >= 1, got ",
                    r->cpu_threads.value_or(0), cpu_threads ? "" : " (from FP8COMM_CPU_THREADS)");
  r->track_error = track_error ? *track_error : env::kTrackError.as_flag();
  r->compress = compress ? parse_compress(*compress, "fp8comm.Options.compress")
                         : parse_compress(split_commas(env::kCompress.value_or_fallback()), env::kCompress.name);
  if (!scope) {
    const std::string name = env::kScope.value_or_fallback();
    const auto found = find_scope(name);
    TORCH_CHECK_VALUE(found, "fp8comm.Options: scope must be 'all' or 'inter_node', got '", name,
                      "' (from FP8COMM_SCOPE)");
    r->scope = *found;
  }
  if (!node_wire_format) {
    r->node_wire_format = env::kNodeWireFormat.value_or_fallback();
    check_node_wire_format(*r->node_wire_format, " (from FP8COMM_NODE_WIRE_FORMAT)");
    // The variable sets the inter_node groups' node phases; a group given
    // scope='all' has none.
    if (scope && *scope == Scope::kAll) r->node_wire_format = "exact";
  }
  // Only the inter_node scope has phases inside a node: a compressed format
  // asked for on a group that compresses every link would go unused.
  TORCH_CHECK_VALUE(*r->node_wire_format == "exact" || *r->scope == Scope::kInterNode,
                    "fp8comm.Options: node_wire_format='", *r->node_wire_format,
                    "' sets the inter_node scope's phases inside a node, but scope is '", scope_name(*r->scope),
                    "'; set scope='inter_node' (FP8COMM_SCOPE) or leave node_wire_format 'exact'");
  if (!rounding) {
    const std::string name = env::kRounding.value_or_fallback();
    Rounding found;
    TORCH_CHECK_VALUE(find_rounding(name, found), "fp8comm.Options: rounding must be 'nearest' or 'stochastic', got '",
                      name, "' (from FP8COMM_ROUNDING)");
    r->rounding = found;
  }
  r->rounding_seed = rounding_seed ? *rounding_seed : env::kRoundingSeed.as_int();
  resolve_block_size(*r, block_size.has_value());
  return r;
}

bool Options::compresses(const CompressedAlgorithm* algorithm) const {
  TORCH_CHECK(compress, "fp8comm.Options: compresses() of options that are not resolved");
  if (!algorithm) return false;
  return std::find(compress->begin(), compress->end(), algorithm->name) != compress->end();
}

std::optional<WireFormat> Options::node_format() const {
  TORCH_CHECK(node_wire_format, "fp8comm.Options: node_format() of options that are not resolved");
  if (*node_wire_format == "exact") return std::nullopt;
  return find_wire_format(*node_wire_format);
}

std::map<std::string, std::string> Options::fingerprint() const {
  TORCH_CHECK(block_size && wire_format && min_numel && compress && scope && node_wire_format && rounding &&
                  rounding_seed,
              "fp8comm.Options: fingerprint() of options that are not resolved");
  return {{"block_size", std::to_string(*block_size)},
          {"wire_format", wire_format_name(*wire_format)},
          {"min_numel", std::to_string(*min_numel)},
          {"compress", compress->empty() ? "none" : join(*compress)},
          {"scope", scope_name(*scope)},
          {"node_wire_format", *node_wire_format},
          {"rounding", rounding_name(*rounding)},
          {"rounding_seed", std::to_string(*rounding_seed)}};
}

}  // namespace fp8comm
