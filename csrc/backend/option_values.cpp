#include "option_values.h"

#include "../algorithms/compressed_algorithms.h"
#include "../common/choices.h"

namespace fp8comm {

namespace {

std::string strip(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
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

template <class E>
std::optional<E> find_exact(const std::string& name, std::initializer_list<E> values) {
  for (E v : values) {
    if (name == Names<E>::name(v)) return v;
  }
  return std::nullopt;
}

}  // namespace

std::vector<std::string> Names<Scope>::all() { return {name(Scope::kAll), name(Scope::kInterNode)}; }
std::optional<Scope> Names<Scope>::find(const std::string& n) {
  return find_exact(n, {Scope::kAll, Scope::kInterNode});
}
std::string Names<Scope>::name(Scope s) { return scope_name(s); }

std::vector<std::string> Names<NodeWire>::all() {
  std::vector<std::string> names{"exact"};
  for (const auto& f : wire_format_names()) names.push_back(f);
  return names;
}
std::optional<NodeWire> Names<NodeWire>::find(const std::string& n) {
  if (n == "exact") return NodeWire{};
  if (const auto f = find_wire_format(n)) return NodeWire{f};
  return std::nullopt;
}
std::string Names<NodeWire>::name(const NodeWire& n) { return n.format ? wire_format_name(*n.format) : "exact"; }

std::vector<std::string> Names<Rounding>::all() { return {name(Rounding::kNearest), name(Rounding::kStochastic)}; }
std::optional<Rounding> Names<Rounding>::find(const std::string& n) {
  Rounding r;
  if (find_rounding(n, r)) return r;
  return std::nullopt;
}

std::string takes(const Ints& v, Source) {
  const int64_t lowest = std::numeric_limits<int64_t>::min(), highest = std::numeric_limits<int64_t>::max();
  if (v.multiple != 1) {
    return "a multiple of " + std::to_string(v.multiple) + " in [" + std::to_string(v.min) + ", " +
           std::to_string(v.max) + "]";
  }
  if (v.min == lowest && v.max == highest) return "an int";
  if (v.max == highest) return "an int >= " + std::to_string(v.min);
  return "an int in [" + std::to_string(v.min) + ", " + std::to_string(v.max) + "]";
}

std::string takes(const Flag&, Source source) {
  return source == Source::kPython ? "True or False" : "0 (off) or 1 (on)";
}

std::string takes(const Ops&, Source source) {
  return "'all' (" + listed(compressed::names(/*in_all_only=*/true), "and", /*quoted=*/false) + ") or 'none'" +
         (source == Source::kPython ? ", or a list or comma-separated string of " : ", or a comma list of ") +
         listed(compressed::names(), "and");
}

std::optional<int64_t> parse(const std::string& text, const Ints& values) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(text, &used);
    if (used == text.size() && values.admits(v)) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

std::optional<bool> parse(const std::string& text, const Flag&) {
  if (text == "0" || text == "1") return text == "1";
  return std::nullopt;
}

std::optional<OpList> parse(const std::string& text, const Ops&) { return select_ops(split_commas(text)); }

std::optional<OpList> select_ops(const std::vector<std::string>& raw) {
  std::vector<std::string> items;
  for (const auto& s : raw) {
    if (!strip(s).empty()) items.push_back(strip(s));
  }
  const OpList all = compressed::names();
  if (items == std::vector<std::string>{"all"}) return compressed::names(/*in_all_only=*/true);
  if (items.empty() || items == std::vector<std::string>{"none"}) return OpList{};
  for (const auto& s : items) {
    if (std::find(all.begin(), all.end(), s) == all.end()) return std::nullopt;
  }
  OpList ops;
  for (const auto& op : all) {
    if (std::find(items.begin(), items.end(), op) != items.end()) ops.push_back(op);
  }
  return ops;
}

std::string text_of(const OpList& ops) {
  std::string out;
  for (const auto& s : ops) out += (out.empty() ? "" : ",") + s;
  return out.empty() ? "none" : out;
}

}  // namespace fp8comm
