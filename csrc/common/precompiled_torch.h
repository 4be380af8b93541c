// The torch headers that most units include, precompiled once per build and
// loaded by every unit that includes torch (build_speed.py): parsing them is
// most of a unit's compile time. Only headers the units include themselves
// belong here, so the build is the same without it. Not included by any source.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/library.h>
