"""The env step of bench/gpu_session.sh: one Python process (a cold torch and
CUDA start is the slow part, so it is paid once) that prints what the build and
the tests rely on and fails, naming each missing piece, before the build is
tried. The toolkit is found as setup.py finds it (build_config.py).

    python3 bench/gpu_session/env_check.py [--no-torch] [--path-file FILE]

--path-file: where to write a folder to put on PATH (ninja's, when only its
Python package has it). --no-torch: the self-tests, which need no torch.
"""
import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
missing = []


def ok(name, text):
    print(f"ok       {name}: {text}", flush=True)


def miss(name, why):
    print(f"MISSING  {name}: {why}", flush=True)
    missing.append(name)


def info(name, text):
    print(f"info     {name}: {text}", flush=True)


def first_line(cmd):
    """The first line a command prints, or None if it cannot run (a hung tool cannot hang the step)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (p.stdout or p.stderr).strip().splitlines()
    return lines[0] if lines else ""


def load_build_config():
    spec = importlib.util.spec_from_file_location("fp8comm_build_config", os.path.join(ROOT, "build_config.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_gpu():
    smi = shutil.which("nvidia-smi")
    if not smi:
        miss("nvidia-smi", "not on PATH: no GPU driver to ask")
        return
    line = first_line([smi, "--query-gpu=name,memory.total,driver_version,compute_mode,clocks.sm,clocks.mem",
                       "--format=csv,noheader"])
    if not line:
        miss("GPU", "nvidia-smi answers no GPU")
        return
    fields = [f.strip() for f in line.split(",")]
    ok("GPU", line)
    mode = fields[3] if len(fields) > 3 else "unknown"
    if mode != "Default":
        miss("compute mode", f"{mode}, not Default: the multi-rank tests and the lanes put several processes on the GPU")


def check_torch():
    try:
        import torch
    except Exception as e:  # noqa: BLE001 (any import failure is the finding)
        miss("torch", f"does not import: {e}")
        return
    ok("torch", f"{torch.__version__} (CUDA {torch.version.cuda}) at {os.path.dirname(torch.__file__)}")
    if not torch.version.cuda:
        miss("CUDA torch", "this torch is built without CUDA: setup.py would build the CPU extension")
    elif not torch.cuda.is_available():
        miss("GPU in torch", "torch sees no GPU")
    else:
        ok("GPU in torch", f"{torch.cuda.get_device_name()}, compute capability "
                           f"{'.'.join(map(str, torch.cuda.get_device_capability()))}")


def check_toolkit(build_config):
    nvcc = shutil.which("nvcc")
    if not nvcc:
        miss("nvcc", "not on PATH: no CUDA build, no kernel compile check")
        return None
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or build_config.toolkit_of_nvcc(nvcc)
    version = build_config.nvcc_version(home)
    ok("nvcc", f"{nvcc}, toolkit {home}, release {'.'.join(map(str, version)) if version else 'unknown'}")
    if not home:
        miss("CUDA toolkit", f"{nvcc} does not say where its toolkit is (nvcc --dryrun)")
    elif build_config.cuda_runtime_found(home):
        ok("libcudart", f"in {home}")
    else:
        miss("libcudart", f"not in {home}/lib64, lib or targets/*/lib: setup.py would build the CPU extension")
    return home


def check_ninja(path_file):
    ninja = shutil.which("ninja")
    if not ninja and importlib.util.find_spec("ninja") is not None:
        try:
            import ninja as ninja_package
            folder = getattr(ninja_package, "BIN_DIR", "")
        except Exception:  # noqa: BLE001
            folder = ""
        if folder and os.path.exists(os.path.join(folder, "ninja")):
            ninja = os.path.join(folder, "ninja")
            if path_file:
                with open(path_file, "w") as f:
                    f.write(folder + "\n")
            info("PATH", f"{folder} put on PATH for the build (ninja's Python package)")
    if ninja:
        ok("ninja", f"{ninja} {first_line([ninja, '--version'])}")
    else:
        miss("ninja", "not on PATH nor in a ninja Python package: torch would compile one file at a time")


def check_compiler():
    cxx = os.environ.get("CXX", "c++")
    for name in (cxx, "gcc"):
        path = shutil.which(name)
        if path:
            ok(name, f"{path}: {first_line([path, '--version'])}")
        else:
            miss(name, "not on PATH: torch compiles the extension's C++ with it")


def check_python():
    ok("python", f"{sys.version.split()[0]} at {sys.executable}")
    header = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if os.path.exists(header):
        ok("Python.h", header)
    else:
        miss("Python.h", f"not at {header}: the extension cannot compile")
    try:
        ok("setuptools", importlib.metadata.version("setuptools"))
    except importlib.metadata.PackageNotFoundError:
        miss("setuptools", "not installed: setup.py cannot run")
    site = sysconfig.get_paths()["purelib"]
    writable = "writable" if os.access(site, os.W_OK) else "NOT writable (the build is in place and needs no install)"
    info("site-packages", f"{site} {writable}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--no-torch", action="store_true", help="leave torch out (the self-tests)")
    p.add_argument("--path-file", help="write here a folder to put on PATH for the build")
    args = p.parse_args(argv)
    check_gpu()
    check_python()
    check_compiler()
    check_ninja(args.path_file)
    home = check_toolkit(load_build_config())
    sanitizer = shutil.which("compute-sanitizer")
    if not sanitizer and home and os.access(os.path.join(home, "bin", "compute-sanitizer"), os.X_OK):
        sanitizer = os.path.join(home, "bin", "compute-sanitizer")
    info("compute-sanitizer", sanitizer or "not found (memcheck and racecheck will SKIP)")
    info("cores", str(os.cpu_count()))
    if not args.no_torch:
        check_torch()  # last: its cold start is the slow part, and the rest is printed before it
    if missing:
        print(f"env: missing: {', '.join(missing)}", flush=True)
        return 1
    print("env: everything the build and the tests rely on is here", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
