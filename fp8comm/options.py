"""Per-process-group options (DESIGN.md, "Options").

:class:`Options` is the C++ ``c10d::Backend::Options`` of fp8nccl / fp8gloo
(csrc/backend/options.h): pass one as ``pg_options`` to
``init_process_group`` or ``new_group``. Its knobs are the rows of one table,
csrc/common/options_table.h (``option_table()`` lists them); fields left as
``None`` take their ``FP8COMM_*`` environment variable when the group is
created, then the variable's unset value; ``environment_variables()`` lists
every variable fp8comm reads (csrc/common/env.h).

The README's and DESIGN's tables are generated from the rows by the functions
below; tests/backend/test_options.py holds the documents to them (and shows
the expected text when they differ).
"""
from __future__ import annotations

from ._C import Options, environment_variables, option_table  # noqa: F401

DEFAULTS = {name: default for name, default, _ in environment_variables()}
DEFAULT_MIN_NUMEL = int(DEFAULTS["FP8COMM_MIN_NUMEL"])


def _python(value) -> str:
    """A default as Python code: strings in double quotes, a tuple as its comma string."""
    if isinstance(value, tuple):
        value = ",".join(value)
    return f'"{value}"' if isinstance(value, str) else repr(value)


def defaults_call() -> str:
    """``fp8comm.Options(...)`` with every knob at its default (README's options row)."""
    return "fp8comm.Options(" + ", ".join(f"{row['name']}={_python(row['default'])}" for row in option_table()) + ")"


def environment_table() -> str:
    """README's "Environment variables" table: every variable, its unset value, what it sets."""
    lines = ["| variable | unset means | sets |", "|---|---|---|"]
    lines += [f"| `{name}` | {unset} | {doc} |" for name, unset, doc in environment_variables()]
    return "\n".join(lines)


def knob_table() -> str:
    """DESIGN's "Options" table: every knob, its variable, what it takes, its default, whether ranks agree."""
    lines = ["| option | variable | takes | default | ranks |", "|---|---|---|---|---|"]
    for row in option_table():
        default = row["unset"] if row["default"] is None else _python(row["default"])
        ranks = "may differ" if row["per_rank"] else "agree (fingerprint)"
        lines.append(f"| {row['name']} | {row['variable']} | {row['takes']} | {default} | {ranks} |")
    return "\n".join(lines)

