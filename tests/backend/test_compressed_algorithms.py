"""The compressed algorithms table (csrc/algorithms/compressed_algorithms.h)
is the one list of compressible ops: the names Options.compress accepts, the
choices its error lists, the Options doc string, and the options tables of
README.md and DESIGN.md all equal it; its phases are the segment headers'
bytes."""
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


def test_the_options_doc_lists_the_table():
    assert f"compress: which of {', '.join(NAMES)} are compressed" in fp8comm.Options.__doc__


def test_the_environment_variable_doc_points_at_the_options_doc():
    # env.h sits below the algorithms: it names no algorithm, so none can be missing there.
    docs = {name: doc for name, _, doc in environment_variables()}
    assert docs["FP8COMM_COMPRESS"].startswith("Options.compress:")
    assert not any(name in docs["FP8COMM_COMPRESS"] for name in NAMES)


@pytest.mark.parametrize("doc, row_start", [("DESIGN.md", "| compress |"), ("README.md", "| `FP8COMM_COMPRESS` |")])
def test_the_options_tables_list_the_table(doc, row_start):
    rows = [line for line in (REPO_ROOT / doc).read_text().splitlines() if line.startswith(row_start)]
    assert len(rows) == 1 and f"comma list of {', '.join(NAMES)}; or all / none" in rows[0]
