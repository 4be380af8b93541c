"""The compressed algorithms table (csrc/backend/compressed_algorithms.h) is
the one list of compressible ops: the names Options.compress accepts, the
choices its error lists, the Options doc string, the FP8COMM_COMPRESS doc
(a literal in csrc/common/env.h) and DESIGN.md's options table all equal it."""
import re

import pytest

import fp8comm
from fp8comm import _C
from fp8comm.options import environment_variables
from tests.support import REPO_ROOT

TABLE = _C.compressed_algorithms()
NAMES = [name for name, _ in TABLE]


def test_each_phase_belongs_to_one_algorithm_with_its_wire_value():
    # The phase values are bytes of the segment header: they never change.
    assert dict(TABLE) == {"all_reduce": [1, 2], "reduce_scatter": [3], "all_gather": [4]}


def test_options_accept_exactly_the_table():
    assert fp8comm.Options(compress="all").resolved().compress == tuple(NAMES)
    for name in NAMES:
        assert fp8comm.Options(compress=[name]).resolved().compress == (name,)
    assert fp8comm.Options(compress=list(reversed(NAMES))).resolved().compress == tuple(NAMES)


def test_the_error_lists_the_table():
    with pytest.raises(ValueError) as raised:
        fp8comm.Options(compress="all_to_all").resolved()
    choices = re.search(r"choose from \[(.*)\], 'all' or 'none'", str(raised.value)).group(1)
    assert choices == ", ".join(f"'{name}'" for name in NAMES)


def test_the_docs_list_the_table():
    docs = {name: doc for name, _, doc in environment_variables()}
    assert docs["FP8COMM_COMPRESS"] == f"Options.compress: comma list of {', '.join(NAMES)}; or all / none"
    assert f"compress: which of {', '.join(NAMES)} are compressed" in fp8comm.Options.__doc__


def test_the_design_options_table_lists_the_table():
    rows = [line for line in (REPO_ROOT / "DESIGN.md").read_text().splitlines() if line.startswith("| compress |")]
    assert len(rows) == 1 and f"comma list of {', '.join(NAMES)}; or all / none" in rows[0]
