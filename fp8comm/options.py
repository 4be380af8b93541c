"""Per-process-group options (DESIGN.md, "Options").

:class:`Options` is the C++ ``c10d::Backend::Options`` of fp8nccl / fp8gloo
(csrc/backend/options.h): pass one as ``pg_options`` to
``init_process_group`` or ``new_group``. Fields left as ``None`` take their
``FP8COMM_*`` environment variable when the group is created, then the
variable's default; ``environment_variables()`` lists every variable
fp8comm reads (csrc/common/env.h).
"""
from __future__ import annotations

from ._C import Options, environment_variables  # noqa: F401

DEFAULTS = {name: default for name, default, _ in environment_variables()}
DEFAULT_MIN_NUMEL = int(DEFAULTS["FP8COMM_MIN_NUMEL"])
