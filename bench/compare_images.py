"""Compare two built images file by file, as verify-repro does (reproducibility/repro.py), without
building them: e.g. a cell built from the old templates against the same cell from the new.

    python bench/compare_images.py IMAGE_A IMAGE_B [--json OUT] [--max-list N]

Every path of each image's filesystem (type, mode, owner, size, SHA-256, link target; not
mtimes) and the image config are compared. Prints the differences by category and each one;
exit 0 when none differ.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from infermatrix.engine.docker import Engine  # noqa: E402
from infermatrix.reproducibility import repro  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", help="image reference or id")
    parser.add_argument("second", help="image reference or id")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write every difference here")
    parser.add_argument("--max-list", type=int, default=200, metavar="N")
    args = parser.parse_args()
    differences, files = repro.compare_images(args.first, args.second, Engine())
    by_category = repro.ReproReport("", [args.first, args.second], files,
                                    differences).by_category()
    print(f"{args.first}: {files[0]} paths, {args.second}: {files[1]} paths")
    print(f"{len(differences)} difference(s)" if differences else
          "identical: every path's type, mode, owner, size, content and link, and the config")
    for name, count in by_category.items():
        print(f"  {count:6d}  {name}")
    for difference in differences[:args.max_list]:
        print("  " + difference.line())
    if len(differences) > args.max_list:
        print(f"  ... {len(differences) - args.max_list} more (--json lists all)")
    if args.json:
        args.json.write_text(json.dumps({"images": [args.first, args.second], "files": files,
                                         "by_category": by_category,
                                         "differences": [d.__dict__ for d in differences]},
                                        indent=1) + "\n", encoding="utf-8")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
