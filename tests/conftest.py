"""Fixtures shared by the test modules.

`pool`: the module's DistPool (tests/support/harness.py), one per PoolSpec in
the module's POOLS list, module-scoped (starting the ranks takes seconds, so a
pool serves every test of its module that uses it). A module with several
specs has its tests parametrized over them, with the specs' ids; a module with
one spec, no id, is not parametrized. A test module declares, e.g.:

    POOLS = PoolSpec.grid(("fp8gloo", "fp8ncclsim"), (2, 3), pg_options={"min_numel": 1024})

A test that needs only some of them names their ids: `@pytest.mark.pools("flat-2")`.
"""
import os

import pytest

from tests.support import tiers


def _specs(module) -> list:
    specs = getattr(module, "POOLS", None)
    assert specs, f"{module.__name__} uses the pool fixture but declares no POOLS"
    return specs


def pytest_generate_tests(metafunc):
    if "pool" not in metafunc.fixturenames:
        return
    specs = _specs(metafunc.module)
    marker = metafunc.definition.get_closest_marker("pools")
    if marker is not None:
        specs = [s for s in specs if s.id in marker.args]
        assert specs, f"{metafunc.function.__name__}: no pool of {metafunc.module.__name__} has an id in {marker.args}"
    if len(specs) > 1 or specs[0].id is not None:
        metafunc.parametrize("pool", specs, ids=[s.id for s in specs], indirect=True, scope="module")


@pytest.fixture(scope="module")
def pool(request):
    spec = request.param if hasattr(request, "param") else _specs(request.module)[0]
    p = spec.start()
    yield p
    p.close()


# ------------------------------------------------------------------ tiers
# tests/support/tiers.py: the README's command runs the fast tier; CI runs
# `--tier full` after it; `--tier all` runs both.
def pytest_addoption(parser):
    parser.addoption("--tier", choices=tiers.TIERS, default=os.environ.get(tiers.ENV, "fast"),
                     help="fast (default: the README's test command), full (the exhaustive tier), or all")


def pytest_configure(config):
    os.environ[tiers.ENV] = config.getoption("--tier")


def pytest_collection_modifyitems(config, items):
    # A case named by its id ("test_x[case]") runs whatever its tier.
    running = "all" if any("[" in arg for arg in config.args) else config.getoption("--tier")
    of = tiers.assign(items)
    dropped = tiers.unplaced(of) if running != "all" else []
    if dropped:
        raise pytest.UsageError(f"tests/support/tiers.py left these with no fast case and no full mark: {dropped[:5]}")
    if running != "all":
        keep = [i for i in items if tiers.selected(of[i], running)]
        if len(keep) != len(items):
            config.hook.pytest_deselected(items=[i for i in items if not tiers.selected(of[i], running)])
            items[:] = keep
    # Modules that declare STARTS_FIRST (the longest) go first, so that xdist's
    # workers, which take modules in this order, end together (stable: a
    # module's tests stay together and in order).
    items.sort(key=lambda i: not getattr(i.module, "STARTS_FIRST", False))
