#pragma once
// The options of one fp8nccl / fp8gloo process group (DESIGN.md, "Options"),
// c10d style: a c10d::Backend::Options, bound to Python as fp8comm.Options
// and passed as `pg_options`. Its fields are the knobs of options_table.h,
// one std::optional per row; a field left unset takes its FP8COMM_*
// variable, then that variable's unset value; resolved() fills and checks
// every field, once, at group creation.
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../common/choices.h"
#include "collectives.h"
#include "option_values.h"
#include "option_variables.h"
#include "options_table.h"

namespace fp8comm {

struct Options : c10d::Backend::Options {
  static constexpr const char* kBackendName = "fp8comm";

  Options() : c10d::Backend::Options(kBackendName) {}

#define FP8C_OPTION_FIELD(name, type, values, variable, unset, share, doc) std::optional<type> name;
  FP8C_OPTIONS(FP8C_OPTION_FIELD)
#undef FP8C_OPTION_FIELD

  // A copy with every field set (from the environment where unset; a rule's
  // knob, cpu_threads, may stay unset) and checked; raises ValueError naming
  // the field, and the variable a value came from.
  c10::intrusive_ptr<Options> resolved() const;
  // Whether resolved() has filled every field that it fills.
  bool is_resolved() const;

  // Of resolved options:
  // Whether `algorithm` (null: none, never) is switched on.
  bool compresses(const CompressedAlgorithm* algorithm) const;
  // The kGroup knobs, by name: what every rank of a group must agree on
  // (device segments carry no header that could catch a mismatch later).
  std::map<std::string, std::string> fingerprint() const;
};

// One row of options_table.h, typed: T the field's value type, V its values.
template <class T, class V>
struct Knob {
  using Type = T;
  const char* name;
  std::optional<T> Options::*field;
  V values;
  const EnvVar& variable;  // its name, unset value and doc
  Share share;

  // What it takes, as errors and docs word it.
  std::string takes(Source source) const {
    if constexpr (std::is_same_v<V, Choices>) {
      return listed(Names<T>::all());
    } else {
      return fp8comm::takes(values, source);
    }
  }
  // The value `text` names; none when it names none the knob admits.
  std::optional<T> parse(const std::string& text) const {
    if constexpr (std::is_same_v<V, Choices>) {
      return Names<T>::find(text);
    } else {
      return fp8comm::parse(text, values);
    }
  }
  bool admits(const T& v) const {
    if constexpr (std::is_same_v<V, Ints>) {
      return values.admits(v);
    } else {
      return true;
    }
  }
  // As the fingerprint and the variable write it.
  std::string text(const T& v) const {
    if constexpr (std::is_same_v<V, Choices>) {
      return Names<T>::name(v);
    } else {
      return text_of(v);
    }
  }
  bool rule_when_unset() const {
    if constexpr (std::is_same_v<V, Ints>) {
      return values.rule_when_unset;
    } else {
      return false;
    }
  }
  // The one error of a value it does not take: `got` as the user wrote it,
  // `from` the variable it came from (empty: the field).
  [[noreturn]] void refuse(const std::string& got, const std::string& from) const {
    TORCH_CHECK_VALUE(false, must_be("fp8comm.Options", name, takes(from.empty() ? Source::kPython : Source::kVariable),
                                     got + (from.empty() ? "" : " (from " + from + ")")));
  }
};

// Calls f(knob) for every row of options_table.h, in order.
template <class F>
void for_each_knob(F&& f) {
#define FP8C_OPTION_KNOB(name, type, values, variable, unset, share, doc) \
  f(Knob<type, decltype(values)>{#name, &Options::name, values, env::of_option::name, Share::share});
  FP8C_OPTIONS(FP8C_OPTION_KNOB)
#undef FP8C_OPTION_KNOB
}

// Names of the knobs, in order.
std::vector<std::string> knob_names();

// The error every rank raises when the ranks' fingerprints (by rank) differ,
// naming each knob that differs, its variable and every rank's value; none
// when they agree.
std::optional<std::string> fingerprint_mismatch(const std::vector<std::map<std::string, std::string>>& by_rank,
                                                 int rank);

// The Options doc string and each variable's doc, generated from the rows.
std::string options_doc();
std::string variable_doc(const EnvVar& variable);

}  // namespace fp8comm
