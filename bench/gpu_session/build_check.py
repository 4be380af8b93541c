"""The build step's program: BUILD_CMD, then CHECK_CMD, which decides.

    python3 bench/gpu_session/build_check.py BUILD_CMD... -- CHECK_CMD...

After a failed BUILD_CMD only an extension written by it counts (the check
runs with FP8COMM_BUILT_AFTER naming a file made before the build): an
extension built and importable counts even if BUILD_CMD failed after
writing it (an install step that could not write to site-packages, say).
"""
import os
import subprocess
import sys
import tempfile


def main(argv):
    if "--" not in argv:
        print("usage: build_check.py BUILD_CMD... -- CHECK_CMD...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    build, check = argv[:cut], argv[cut + 1:]
    with tempfile.NamedTemporaryFile(prefix="fp8comm-build-stamp-") as stamp:
        sys.stdout.flush()
        rc = subprocess.call(build)
        print(f"== build: the build command exited {rc}; the import check: {' '.join(check)}", flush=True)
        if rc == 0:
            if subprocess.call(check) == 0:
                return 0
            print("== build: the build command passed, but the import check failed", flush=True)
            return 1
        if subprocess.call(check, env={**os.environ, "FP8COMM_BUILT_AFTER": stamp.name}) == 0:
            print(f"== build: counted as built: the build command exited {rc}, but the extension it wrote imports "
                  "with has_cuda", flush=True)
            return 0
    print(f"== build: the build command exited {rc} and the import check failed", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
