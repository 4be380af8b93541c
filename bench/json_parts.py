"""The one-GPU benches' result file (cluster-1gpu.json): each bench writes its
part, keeping the others, and every write replaces the file whole, so a call
cut short never leaves it half written. Torch-free: bench/gpu_session's
side-by-side wrapper writes through it too."""
from __future__ import annotations

import json
import os


def write_whole(path: str, doc: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    aside = f"{path}.aside"
    with open(aside, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(aside, path)


def write_part(path: str, part: str, doc: dict) -> None:
    """doc as `part` of the JSON at path (its other parts kept), replaced whole."""
    whole = {}
    if os.path.exists(path):
        try:
            with open(path) as f:
                whole = json.load(f)
        except (OSError, ValueError):
            whole = {}
    whole.setdefault("benchmark", "cluster-1gpu")
    whole.setdefault("parts", {})[part] = doc
    write_whole(path, whole)
