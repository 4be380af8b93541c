"""The build step's import check: fp8comm's extension imports from this tree
(not an installed copy), was written by this build when FP8COMM_BUILT_AFTER
names a file made before it, and has CUDA."""
import os

import fp8comm

path = os.path.realpath(fp8comm._C.__file__)
assert path.startswith(os.path.realpath(os.getcwd()) + os.sep), f"fp8comm._C imported from {path}, not this tree"
stamp = os.environ.get("FP8COMM_BUILT_AFTER")
assert not stamp or os.path.getmtime(path) >= os.path.getmtime(stamp), f"{path} is older than this build"
assert fp8comm._C.has_cuda, "fp8comm was built without CUDA: see the 'fp8comm setup:' lines of build.log"
print("fp8comm._C with CUDA:", path)
