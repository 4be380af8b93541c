"""The compressed algorithms table (csrc/algorithms/compressed_algorithms.h)
is the one list of compressible ops: the names Options.compress accepts, the
choices its error lists, the Options doc string, and the options tables of
README.md and DESIGN.md all equal it; its phases are the segment headers'
bytes; its in_all column is what compress="all" names (rows added later,
all_to_all and reduce, compress only where named)."""
import re

import pytest

import fp8comm
from fp8comm import _C
from fp8comm.options import environment_variables
from tests.support import REPO_ROOT

TABLE = _C.compressed_algorithms()
NAMES = [name for name, _, _ in TABLE]
IN_ALL = [name for name, _, in_all in TABLE if in_all]


def test_each_phase_belongs_to_one_algorithm_with_its_wire_value():
    # The phase values are bytes of the segment header: they never change.
    assert {name: phases for name, phases, _ in TABLE} == {"all_reduce": [1, 2], "reduce_scatter": [3],
                                                           "all_gather": [4], "all_to_all": [5], "reduce": [6]}


def test_all_names_the_collectives_it_named_before():
    """compress="all" (and FP8COMM_COMPRESS=all) must not widen when a row is added."""
    assert IN_ALL == ["all_reduce", "reduce_scatter", "all_gather"]


def test_options_accept_exactly_the_table():
    assert fp8comm.Options(compress="all").resolved().compress == tuple(IN_ALL)
    for name in NAMES:
        assert fp8comm.Options(compress=[name]).resolved().compress == (name,)
    assert fp8comm.Options(compress=list(reversed(NAMES))).resolved().compress == tuple(NAMES)


def test_the_error_lists_the_table():
    with pytest.raises(ValueError) as raised:
        fp8comm.Options(compress="broadcast").resolved()
    listed = re.search(r"comma-separated string of (.*), got 'broadcast'", str(raised.value)).group(1)
    assert listed == ", ".join(f"'{name}'" for name in NAMES[:-1]) + f" and '{NAMES[-1]}'"


def test_the_options_doc_lists_the_table():
    doc = " ".join(fp8comm.Options.__doc__.split("\n    "))
    assert "compress: which collectives are compressed. Takes 'all' (" + ", ".join(IN_ALL[:-1]) + f" and {IN_ALL[-1]}) " \
           "or 'none', or a list or comma-separated string of " \
           + ", ".join(f"'{name}'" for name in NAMES[:-1]) + f" and '{NAMES[-1]}'" in doc


def test_the_environment_variable_doc_lists_the_table():
    docs = {name: doc for name, _, doc in environment_variables()}
    ops = ", ".join(f"'{name}'" for name in NAMES[:-1]) + f" and '{NAMES[-1]}'"
    every = ", ".join(IN_ALL[:-1]) + f" and {IN_ALL[-1]}"
    assert docs["FP8COMM_COMPRESS"].startswith(f"Options.compress ('all' ({every}) or 'none', or a comma list of {ops}):")


@pytest.mark.parametrize("doc, row_start", [("DESIGN.md", "| compress |"), ("README.md", "| `FP8COMM_COMPRESS` |")])
def test_the_options_tables_list_the_table(doc, row_start):
    rows = [line for line in (REPO_ROOT / doc).read_text().splitlines() if line.startswith(row_start)]
    assert len(rows) == 1 and all(name in rows[0] for name in NAMES)
