"""The build decision (build_config.py, used by setup.py): CUDA or CPU-only
extension, the default GPU targets, and the warning when nvcc and torch's CUDA
differ in major version. Runs on the CPU: torch and nvcc are stood in for."""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
from tests.support import REPO_ROOT

ROOT = str(REPO_ROOT)


def _load():
    spec = importlib.util.spec_from_file_location("fp8comm_build_config", os.path.join(ROOT, "build_config.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bc = _load()


def fake_cuda_home(tmp_path, release):
    """A CUDA_HOME whose bin/nvcc prints `nvcc --version` output of `release` ("12.4")."""
    home = tmp_path / f"cuda-{release}"
    (home / "bin").mkdir(parents=True, exist_ok=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "nvcc: NVIDIA (R) Cuda compiler driver"
        echo "Cuda compilation tools, release {release}, V{release}.88"
        """))
    nvcc.chmod(0o755)
    (home / "lib64").mkdir(exist_ok=True)
    (home / "lib64" / "libcudart.so").write_text("")
    return str(home)


def test_cpu_torch_builds_cpu_only():
    plan = bc.decide(None, "/usr/local/cuda", (12, 4), {}, cudart=True)
    assert not plan.cuda and plan.arch_list is None and plan.warnings == ()


def test_matching_major_builds_cuda_with_ptx_by_default():
    plan = bc.decide("12.8", "/usr/local/cuda", (12, 4), {}, cudart=True)
    assert plan.cuda and plan.arch_list == "9.0+PTX" and plan.warnings == ()


def test_users_arch_list_wins():
    plan = bc.decide("12.8", "/usr/local/cuda", (12, 8), {"TORCH_CUDA_ARCH_LIST": "8.0;9.0a"}, cudart=True)
    assert plan.cuda and plan.arch_list == "8.0;9.0a"
    assert bc.decide("12.8", "/usr/local/cuda", (12, 8), {"TORCH_CUDA_ARCH_LIST": " "}, cudart=True).arch_list == "9.0+PTX"


def test_mismatched_major_builds_cpu_only_with_a_warning_that_says_how_to_fix_it():
    plan = bc.decide("12.8", "/opt/cuda-13", (13, 0), {}, cudart=True)
    assert not plan.cuda and plan.arch_list is None
    (msg,) = plan.warnings
    assert msg.startswith(bc.WARNING_PREFIX)
    for part in ("nvcc 13.0", "CUDA 12.8", "major", "WITHOUT its CUDA kernels", "CUDA 12.x toolkit", "CUDA_HOME",
                 "/opt/cuda-13", "FP8COMM_FORCE_CPU=1"):
        assert part in msg, part


def test_force_cpu():
    plan = bc.decide("12.8", "/usr/local/cuda", (12, 8), {"FP8COMM_FORCE_CPU": "1"}, cudart=True)
    assert not plan.cuda and plan.warnings == ()
    assert bc.decide("12.8", "/usr/local/cuda", (12, 8), {"FP8COMM_FORCE_CPU": "0"}, cudart=True).cuda


@pytest.mark.parametrize("cuda_home,nvcc", [(None, None), ("/usr/local/cuda", None)])
def test_cuda_torch_without_a_usable_nvcc_builds_cpu_only_with_a_warning(cuda_home, nvcc):
    plan = bc.decide("12.8", cuda_home, nvcc, {}, cudart=True)
    assert not plan.cuda
    (msg,) = plan.warnings
    assert msg.startswith(bc.WARNING_PREFIX) and "CUDA_HOME" in msg and "WITHOUT its CUDA kernels" in msg


def test_a_toolkit_without_its_runtime_builds_cpu_only_with_a_warning_that_names_it():
    plan = bc.decide("13.0", "/usr/local", (13, 0), {}, cudart=False)
    assert not plan.cuda
    (msg,) = plan.warnings
    assert msg.startswith(bc.WARNING_PREFIX) and "CUDA_HOME=/usr/local" in msg and "libcudart" in msg


def test_cuda_runtime_found(tmp_path):
    assert bc.cuda_runtime_found(fake_cuda_home(tmp_path, "13.0"))
    (tmp_path / "bare" / "bin").mkdir(parents=True)
    assert not bc.cuda_runtime_found(str(tmp_path / "bare"))
    targets = tmp_path / "split" / "targets" / "x86_64-linux" / "lib"
    targets.mkdir(parents=True)
    (targets / "libcudart.so.13").write_text("")
    assert bc.cuda_runtime_found(str(tmp_path / "split"))


def test_a_wrapper_nvcc_on_path_resolves_to_its_toolkit(tmp_path):
    """The nvcc on PATH is a script in another folder that execs the real one:
    the toolkit is where the real one lives, as its --dryrun reports."""
    real = tmp_path / "cuda-13.0" / "bin"
    real.mkdir(parents=True)
    (real / "nvcc").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo '#$ _HERE_={real}'
        echo '#$ TOP={real}/..'
        echo '#$ NVVMIR_LIBRARY_DIR={real}/../nvvm/libdevice'
        """))
    (real / "nvcc").chmod(0o755)
    wrapper = tmp_path / "local" / "bin" / "nvcc"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f"#!/bin/sh\nexec {real}/nvcc \"$@\"\n")
    wrapper.chmod(0o755)
    assert bc.toolkit_of_nvcc(str(wrapper)) == str(tmp_path / "cuda-13.0")
    assert bc.toolkit_of_nvcc(str(tmp_path / "missing")) is None
    assert bc.toolkit_of_nvcc(None) is None


@pytest.mark.parametrize("version,error,warning", [
    ("2.13.0+cpu", False, False), ("2.11.0+cu130", False, False), ("2.12.1", False, False),
    ("2.15.0+cu132", False, False), ("2.16.0", False, True), ("3.0.0", False, True), ("2.10.0", True, False),
    ("1.13.1", True, False), ("nightly", False, True)])
def test_torch_version_check(version, error, warning):
    err, warn = bc.torch_version_check(version)
    assert (err is not None, warn is not None) == (error, warning)
    if err:
        assert "2.11" in err and version in err
    if warn:
        assert warn.startswith(bc.WARNING_PREFIX) and "2.11 through 2.15" in warn


def test_the_tested_releases_are_the_ones_ci_installs():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        run = f.read()
    with open(os.path.join(ROOT, ".ci", "cuda_torch_check")) as f:
        cuda = f.read()
    assert "torch==2.13.0" in run and "FP8COMM_CUDA_TORCH:-2.11.0" in cuda and "cuda_torch_check" in run
    assert "cuda_leg 2.11.0" in run and "cuda_leg 2.15.0" in run
    assert bc.TESTED_TORCH == ((2, 11), (2, 13), (2, 15))
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert '"torch>=2.11,<2.16"' in f.read()


def test_parse_nvcc_version():
    text = ("nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\n"
            "Built on Wed_Aug_20_01:58:59_PM_PDT_2025\nCuda compilation tools, release 13.0, V13.0.88\n")
    assert bc.parse_nvcc_version(text) == (13, 0)
    assert bc.parse_nvcc_version("Cuda compilation tools, release 12.4, V12.4.131") == (12, 4)
    assert bc.parse_nvcc_version("command not found") is None
    assert bc.parse_nvcc_version("") is None


def test_nvcc_version_runs_cuda_homes_nvcc(tmp_path):
    assert bc.nvcc_version(fake_cuda_home(tmp_path, "12.6")) == (12, 6)
    assert bc.nvcc_version(str(tmp_path / "nowhere")) is None
    assert bc.nvcc_version(None) is None


# setup.py itself, run with setuptools.setup captured, once per case in one
# subprocess (importing torch is the slow part): the plan reaches the extension.
DRIVER = textwrap.dedent("""\
    import contextlib, io, json, os, runpy, sys
    import setuptools, torch
    from torch.utils import cpp_extension
    cases = json.loads(sys.argv[2])
    os.chdir(sys.argv[1])
    results = []
    for torch_cuda, cuda_home, env in cases:
        for key in ("TORCH_CUDA_ARCH_LIST", "FP8COMM_FORCE_CPU"):
            os.environ.pop(key, None)
        os.environ.update(env)
        torch.version.cuda = torch_cuda
        cpp_extension.CUDA_HOME = cuda_home
        captured = {}
        setuptools.setup = lambda **kw: captured.update(kw)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            runpy.run_path("setup.py", run_name="__main__")
        (ext,) = captured["ext_modules"]
        results.append({
            "name": ext.name,
            "cu": sorted(s for s in ext.sources if s.endswith(".cu")),
            "macros": [list(m) for m in ext.define_macros],
            "arch": os.environ.get("TORCH_CUDA_ARCH_LIST"),
            "stderr": err.getvalue(),
        })
    print("RESULT " + json.dumps(results))
    """)

SETUP_CASES = {  # name: (torch.version.cuda, nvcc release of CUDA_HOME or None for a CPU torch's None, env)
    "matching": ("12.8", "12.4", {}),
    "users_arch": ("12.8", "12.4", {"TORCH_CUDA_ARCH_LIST": "10.0"}),
    "mismatch": ("12.8", "13.0", {}),
    "cpu_torch": (None, "12.4", {}),
    "force_cpu": ("12.8", "12.4", {"FP8COMM_FORCE_CPU": "1"}),
}


@pytest.fixture(scope="module")
def setup_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("setup_py")
    cases = [[torch_cuda, fake_cuda_home(tmp, release), env] for torch_cuda, release, env in SETUP_CASES.values()]
    driver = tmp / "driver.py"
    driver.write_text(DRIVER)
    p = subprocess.run([sys.executable, str(driver), ROOT, json.dumps(cases)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    return dict(zip(SETUP_CASES, json.loads(line[len("RESULT "):])))


def test_setup_py_builds_cuda_with_a_matching_nvcc(setup_runs):
    r = setup_runs["matching"]
    assert r["name"] == "fp8comm._C"
    assert r["cu"] and ["FP8COMM_WITH_CUDA", "1"] in r["macros"]
    assert r["arch"] == "9.0+PTX"
    assert bc.WARNING_PREFIX not in r["stderr"]


def test_setup_py_keeps_the_users_arch_list(setup_runs):
    r = setup_runs["users_arch"]
    assert r["cu"] and r["arch"] == "10.0"


def test_setup_py_builds_cpu_only_with_a_warning_on_a_major_mismatch(setup_runs):
    r = setup_runs["mismatch"]
    assert r["cu"] == [] and ["FP8COMM_WITH_CUDA", "1"] not in r["macros"]
    assert r["arch"] is None
    assert bc.WARNING_PREFIX in r["stderr"] and "nvcc 13.0" in r["stderr"] and "CUDA 12.8" in r["stderr"]


@pytest.mark.parametrize("case", ["cpu_torch", "force_cpu"])
def test_setup_py_cpu_torch_and_force_cpu(setup_runs, case):
    r = setup_runs[case]
    assert r["cu"] == [] and r["arch"] is None and bc.WARNING_PREFIX not in r["stderr"]
