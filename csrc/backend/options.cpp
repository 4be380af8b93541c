#include "options.h"

#include <algorithm>

#include "../codec/codec_tensor.h"
#include "../common/choices.h"

namespace fp8comm {

namespace {

// The variable an unset knob is read from: its own; for wire_format, while
// that is unset, the deprecated FP8COMM_FP8_DTYPE.
const EnvVar& variable_for(const std::string& knob, const EnvVar& own) {
  if (knob != "wire_format" || own.read() || !env::kFp8Dtype.read()) return own;
  TORCH_WARN_ONCE("fp8comm: ", env::kFp8Dtype.name, " is deprecated; set ", own.name, "=", *env::kFp8Dtype.read(),
                  " instead");
  return env::kFp8Dtype;
}

template <class K>
typename K::Type parse_or_refuse(const K& k, const std::string& text, const char* variable) {
  const auto v = k.parse(text);
  if (!v) k.refuse("'" + text + "'", variable);
  return *v;
}

// `text` wrapped at `width` columns, lines after the first indented by `indent`.
std::string wrap(const std::string& text, size_t width, const std::string& indent) {
  std::string out, line;
  bool fresh = true;  // no word on `line` yet
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!fresh && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line = indent;
      fresh = true;
    }
    line += (fresh ? "" : " ") + word;
    fresh = false;
    start = end + 1;
  }
  return out + line;
}

}  // namespace

namespace {

// block_size, once the formats are known: unset (no field, no variable), the
// size a format in use requires (NVFP4's 16), else the row's default; every
// format in use must take it (one call's phases share one chunk plan).
void resolve_block_size(Options& r, bool given) {
  const std::optional<WireFormat> node = r.node_wire_format->format;
  const int required = required_block_size(*r.wire_format) != 0 ? required_block_size(*r.wire_format)
                       : node                                  ? required_block_size(*node)
                                                               : 0;
  if (!given && required != 0) r.block_size = required;
  const char* where = given ? "fp8comm.Options" : "fp8comm.Options (the wire format's block size)";
  check_block_size(*r.block_size, *r.wire_format, where);
  if (node) check_block_size(*r.block_size, *node, where);
}

}  // namespace

c10::intrusive_ptr<Options> Options::resolved() const {
  auto r = c10::make_intrusive<Options>(*this);
  for_each_knob([&](const auto& k) {
    auto& value = (*r).*k.field;
    if (value) {
      if (!k.admits(*value)) k.refuse(k.text(*value), "");
      return;
    }
    const EnvVar& variable = variable_for(k.name, k.variable);
    if (const auto raw = variable.read()) {
      value = parse_or_refuse(k, *raw, variable.name);
    } else if (!k.rule_when_unset()) {
      value = parse_or_refuse(k, k.variable.fallback, k.variable.name);
    }
  });
  // The variable sets the inter_node groups' node phases; a group given
  // scope='all' has none.
  if (!node_wire_format && scope == Scope::kAll) r->node_wire_format = NodeWire{};
  // Only the inter_node scope has phases inside a node: a compressed format
  // asked for on a group that compresses every link would go unused.
  TORCH_CHECK_VALUE(!r->node_wire_format->format || *r->scope == Scope::kInterNode,
                    "fp8comm.Options: node_wire_format='", Names<NodeWire>::name(*r->node_wire_format),
                    "' sets the inter_node scope's phases inside a node, but scope is '", scope_name(*r->scope),
                    "'; set scope='inter_node' (", env::of_option::scope.name,
                    ") or leave node_wire_format 'exact'");
  resolve_block_size(*r, block_size.has_value() || env::of_option::block_size.read().has_value());
  return r;
}

bool Options::is_resolved() const {
  bool resolved = true;
  for_each_knob([&](const auto& k) { resolved = resolved && ((this->*k.field) || k.rule_when_unset()); });
  return resolved;
}

bool Options::compresses(const CompressedAlgorithm* algorithm) const {
  TORCH_CHECK(compress, "fp8comm.Options: compresses() of options that are not resolved");
  if (!algorithm) return false;
  return std::find(compress->begin(), compress->end(), algorithm->name) != compress->end();
}

std::map<std::string, std::string> Options::fingerprint() const {
  TORCH_CHECK(is_resolved(), "fp8comm.Options: fingerprint() of options that are not resolved");
  std::map<std::string, std::string> out;
  for_each_knob([&](const auto& k) {
    if (k.share == Share::kGroup) out[k.name] = k.text(*(this->*k.field));
  });
  return out;
}

std::vector<std::string> knob_names() {
  std::vector<std::string> names;
  for_each_knob([&](const auto& k) { names.emplace_back(k.name); });
  return names;
}

std::optional<std::string> fingerprint_mismatch(const std::vector<std::map<std::string, std::string>>& by_rank,
                                                int rank) {
  const auto& mine = by_rank.at(rank);
  std::string details;
  for_each_knob([&](const auto& k) {
    const auto at = mine.find(k.name);
    if (at == mine.end()) return;
    const bool differs = std::any_of(by_rank.begin(), by_rank.end(), [&](const auto& other) {
      const auto o = other.find(k.name);
      return o == other.end() || o->second != at->second;
    });
    if (!differs) return;
    // Numbers as they are, names quoted.
    const bool number = std::is_same_v<std::decay_t<decltype(k.values)>, Ints>;
    std::string ranks;
    for (size_t r = 0; r < by_rank.size(); ++r) {
      const auto v = by_rank[r].find(k.name);
      const std::string shown = v == by_rank[r].end() ? "nothing" : number ? v->second : "'" + v->second + "'";
      ranks += (ranks.empty() ? "" : ", ") + ("rank " + std::to_string(r) + " has " + shown);
    }
    details += (details.empty() ? "" : "; ") + std::string(k.name) + ": " + ranks + " (" + k.variable.name + ")";
  });
  if (details.empty()) return std::nullopt;
  return "fp8comm: the ranks of this process group resolved different options (" + details +
         "). Every rank must pass the same fp8comm.Options and set the same FP8COMM_* environment variables.";
}

std::string options_doc() {
  std::string doc =
      "Options of one fp8nccl / fp8gloo process group; pass as ``pg_options`` to\n"
      "``init_process_group`` or ``new_group``. Keyword arguments only. A field left as None\n"
      "takes its FP8COMM_* environment variable when the group is created (resolved()),\n"
      "then the variable's unset value. Every rank must resolve the same options (checked\n"
      "when the group is created), those marked per process excepted.\n\n";
  for_each_knob([&](const auto& k) {
    std::string line = std::string(k.name) + ": " + k.variable.doc + ". Takes " + k.takes(Source::kPython) +
                       "; unset: " + k.variable.name + ", else " + k.variable.fallback + ".";
    if (k.share == Share::kRank) line += " Per process: ranks may differ.";
    doc += wrap(line, 88, "    ") + "\n";
  });
  doc += wrap("fp8_dtype: deprecated spelling of wire_format for the FP8 formats (" + fp8_dtype_choices(true) + ").",
              88, "    ");
  return doc;
}

std::string variable_doc(const EnvVar& variable) {
  std::string doc = variable.doc;
  for_each_knob([&](const auto& k) {
    if (&k.variable != &variable) return;
    doc = "Options." + std::string(k.name) + " (" + k.takes(Source::kVariable) + "): " + variable.doc;
    if (k.share == Share::kRank) doc += "; per process";
  });
  return doc;
}

}  // namespace fp8comm
