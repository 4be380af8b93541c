"""python -m fp8comm.options [--write-docs]: prints DESIGN's knob table, or
rewrites fp8comm/_C.pyi and the README / DESIGN tables from the rows."""
from __future__ import annotations

import argparse

from . import knob_table, write_docs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp8comm.options",
                                     description="fp8comm.Options: its knob table, or --write-docs")
    parser.add_argument("--write-docs", action="store_true",
                        help="rewrite fp8comm/_C.pyi and the README / DESIGN tables from the rows")
    args = parser.parse_args(argv)
    if not args.write_docs:
        print(knob_table())
        return 0
    changed = write_docs()
    print("rewrote " + ", ".join(changed) if changed else "already in step: nothing to write")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
