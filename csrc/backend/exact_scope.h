#pragma once
// The exact scope: while a thread holds it open, every call that thread makes
// on any fp8 group passes through exactly. fp8comm opens it around the
// functions that gather a full state dict (fp8comm/state_dict_exact.py), so a
// checkpoint holds the weights bit for bit: DESIGN.md, "State dicts are exact".
//
// Not collective, unlike an uncompressed block: the functions it wraps are
// collectives themselves, reached by every rank at the same point, so every
// rank opens it at the same call.
namespace fp8comm {
namespace exact_scope {

// Open scopes of the calling thread (they nest).
inline thread_local int depth = 0;

inline bool active() { return depth > 0; }
inline void enter() { ++depth; }
inline void leave() {
  if (depth > 0) --depth;
}

}  // namespace exact_scope
}  // namespace fp8comm
