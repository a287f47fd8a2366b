"""``python -m tools.deepspeed_census``: regenerate the census files from installed packages."""

from __future__ import annotations

import os

from .engine_names import TARGET, engine_names, render

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    path = os.path.join(ROOT, TARGET)
    with open(path, "w") as f:
        f.write(render(*engine_names()))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
