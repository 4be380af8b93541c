#pragma once
// The kinds of value an Options knob holds (options_table.h's type and values
// columns): what each takes, how it is read from text (its variable, or the
// string Python gives an enum) and how it is written (the fingerprint, repr,
// docs). Each enum is parsed in one place, by its own name table (Names<E>):
// the wire formats' is kWireFormatTable, so a new format is a choice of every
// knob that takes one without a change here.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "../codec/fp8_dtype_table.h"
#include "../codec/rounding.h"

namespace fp8comm {

// Which links carry FP8 (DESIGN.md, "Topology"): every link, or only the
// hop between nodes (exact inside a node).
enum class Scope : uint8_t { kAll, kInterNode };

// The inter_node scope's phases inside a node: exact (no format), or
// compressed in a wire format.
struct NodeWire {
  std::optional<WireFormat> format;
  bool operator==(const NodeWire& other) const { return format == other.format; }
  bool operator!=(const NodeWire& other) const { return !(*this == other); }
};

// The collectives compressed: names of compressed::kAll, in its order.
using OpList = std::vector<std::string>;

// kGroup: every rank of a group must agree (the knob changes the bytes or the
// calls on the wire), so it is in the fingerprint; kRank: each process may
// set its own.
enum class Share { kGroup, kRank };

// Whom the words of what a knob takes are for: Python (True, a list) or an
// environment variable's text (1, a comma list).
enum class Source { kPython, kVariable };

// values: integers in [min, max] that are a multiple of `multiple`.
struct Ints {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
  int64_t multiple = 1;
  // Unset, the knob stays unset: its variable's unset text names a rule the
  // backend applies (cpu_threads), not a value.
  bool rule_when_unset = false;

  constexpr Ints unset_is_rule() const {
    Ints i = *this;
    i.rule_when_unset = true;
    return i;
  }
  bool admits(int64_t v) const { return v >= min && v <= max && v % multiple == 0; }
};
constexpr Ints any_int() { return {}; }
constexpr Ints at_least(int64_t min) { return Ints{min}; }
constexpr Ints multiple_in(int64_t multiple, int64_t min, int64_t max) { return Ints{min, max, multiple}; }

// values: True or False (a variable: 0 or 1).
struct Flag {};
constexpr Flag flag() { return {}; }

// values: the names of the knob's enum type, from its table (Names<E>).
struct Choices {};
constexpr Choices choices() { return {}; }

// values: a subset of the compressed algorithms, by name; "all" or "none".
struct Ops {};
constexpr Ops op_list() { return {}; }

// The name table of an enum type a knob takes: every name in order, the
// value a name stands for, the name of a value.
template <class E>
struct Names;

template <>
struct Names<WireFormat> {
  static std::vector<std::string> all() { return wire_format_names(); }
  static std::optional<WireFormat> find(const std::string& name) { return find_wire_format(name); }
  static std::string name(WireFormat f) { return wire_format_name(f); }
};

template <>
struct Names<Scope> {
  static std::vector<std::string> all();
  static std::optional<Scope> find(const std::string& name);
  static std::string name(Scope s);
};

template <>
struct Names<NodeWire> {
  static std::vector<std::string> all();  // "exact", then the wire formats
  static std::optional<NodeWire> find(const std::string& name);
  static std::string name(const NodeWire& n);
};

template <>
struct Names<Rounding> {
  static std::vector<std::string> all();
  static std::optional<Rounding> find(const std::string& name);
  static std::string name(Rounding r) { return rounding_name(r); }
};

inline const char* scope_name(Scope s) { return s == Scope::kInterNode ? "inter_node" : "all"; }

// What `values` takes, as errors and docs word it.
std::string takes(const Ints& values, Source source);
std::string takes(const Flag& values, Source source);
std::string takes(const Ops& values, Source source);

// A value from text; none when the text names none that `values` admits.
std::optional<int64_t> parse(const std::string& text, const Ints& values);
std::optional<bool> parse(const std::string& text, const Flag& values);
std::optional<OpList> parse(const std::string& text, const Ops& values);
// Op names (or "all" / "none") -> the ops in compressed::kAll's order; none
// when a name is no compressed algorithm's. "all": the algorithms whose row
// says compress="all" names them (CompressedAlgorithm::in_all).
std::optional<OpList> select_ops(const std::vector<std::string>& names);

// A value as the fingerprint, repr and the variables write it.
inline std::string text_of(int64_t v) { return std::to_string(v); }
inline std::string text_of(bool v) { return v ? "1" : "0"; }
std::string text_of(const OpList& ops);

}  // namespace fp8comm
