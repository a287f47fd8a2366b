"""``python -m tools.deepspeed_census [NAME=PATH@REVISION ...]``: regenerate the census.

Always rescans the installed clients (`INSTALLED`) and regenerates the engine-name list from the
installed DeepSpeed. Each ``NAME=PATH@REVISION`` argument rescans a source checkout (DeepSpeed's
examples, Megatron-DeepSpeed) at PATH; sources not given keep their entries from the existing
census.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys

from .engine_names import TARGET, engine_names, render
from .scan import scan_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CENSUS = os.path.join(ROOT, "runtime", "deepspeed_api", "census.json")

# installed client -> (distribution, the package folders scanned)
INSTALLED = {
    "transformers": ("transformers", ["transformers"]),
    "accelerate": ("accelerate", ["accelerate"]),
    "pytorch-lightning": ("pytorch-lightning", ["pytorch_lightning", "lightning_fabric"]),
    "trl": ("trl", ["trl"]),
    "peft": ("peft", ["peft"]),
}


def _installed_sources() -> dict[str, tuple[str, list[str]]]:
    """source name -> (its label with version, the folders to scan)."""
    out = {}
    for source, (dist, packages) in INSTALLED.items():
        version = importlib.metadata.version(dist)
        folders = [os.path.dirname(importlib.util.find_spec(p).origin) for p in packages]
        out[source] = (f"{dist} {version} (installed)", folders)
    return out


def build(trees: dict[str, tuple[str, str]], previous: dict | None) -> dict:
    _, names = engine_names()
    sources = {k: v for k, v in (previous or {}).get("sources", {}).items()}
    entries: dict[tuple[str, str], list[str]] = {}
    for entry in (previous or {}).get("entries", []):
        kept = [w for w in entry["from"] if w.split(":", 1)[0] not in set(trees) | set(INSTALLED)]
        if kept:
            entries[(entry["kind"], entry["name"])] = kept
    scans = {s: (label, folders) for s, (label, folders) in _installed_sources().items()}
    for source, (path, revision) in trees.items():
        scans[source] = (f"{source} at {revision}", [path])
    for source, (label, folders) in scans.items():
        sources[source] = label
        for folder in folders:
            base = os.path.basename(folder) if source in INSTALLED else ""
            for kind, name, rel, line in scan_tree(folder, names):
                where = f"{source}:{os.path.join(base, rel)}:{line}"
                entries.setdefault((kind, name), []).append(where)
    return {
        "about": (
            "Every deepspeed.X.Y module, attribute and DeepSpeedEngine attribute the clients "
            "below reach, with where (source:file:line). Regenerate with python -m "
            "tools.deepspeed_census; tests/unit/deepspeed_api/test_census.py resolves each "
            "against the bundled package."
        ),
        "sources": dict(sorted(sources.items())),
        "entries": [
            {"kind": kind, "name": name, "from": sorted(set(where))[:5], "uses": len(set(where))}
            for (kind, name), where in sorted(entries.items())
        ],
    }


def main(argv: list[str]) -> None:
    trees = {}
    for arg in argv:
        name, _, rest = arg.partition("=")
        path, _, revision = rest.partition("@")
        trees[name] = (path, revision or "unknown")
    previous = None
    if os.path.exists(CENSUS):
        with open(CENSUS) as f:
            previous = json.load(f)
    census = build(trees, previous)
    with open(CENSUS, "w") as f:
        json.dump(census, f, indent=1)
        f.write("\n")
    with open(os.path.join(ROOT, TARGET), "w") as f:
        f.write(render(*engine_names()))
    print(f"wrote {CENSUS}: {len(census['entries'])} entries from {', '.join(census['sources'])}")


if __name__ == "__main__":
    main(sys.argv[1:])
