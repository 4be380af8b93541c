"""Reading fp8comm.get_stats in tests."""
from __future__ import annotations


def calls(stats: dict) -> dict:
    """{op: {"compressed": n, "passthrough": n}} of stats' per_op, its bytes,
    reasons and errors left out."""
    return {op: {"compressed": e["compressed"], "passthrough": e["passthrough"]} for op, e in stats["per_op"].items()}
