"""A small copy of the training text for a device call, whose carry beside the tree is a few MB: every file
tools/train.py reads (its TRAIN_FILES), each cut to its first ``--fraction`` of documents (at least one), the .xz
files compressed again. Written beside ``--out`` first and moved into place whole.

    python3 tools/train_data_subset.py --data-dir ../shared/data --out .devdata_subset --fraction 0.08
"""
import argparse
import lzma
import shutil
from pathlib import Path

from train import TRAIN_FILES


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--fraction", type=float, required=True)
    args = p.parse_args()
    if not 0 < args.fraction <= 1:
        p.error(f"--fraction must be in (0, 1]; got {args.fraction}")
    missing = [rel for rel in TRAIN_FILES if not (Path(args.data_dir) / rel).is_file()]
    if missing:
        p.error(f"--data-dir {args.data_dir} lacks {', '.join(missing)} (the shared data folder has them)")
    out = Path(args.out)
    partial = out.with_name(out.name + ".partial")  # moved into place once every file is written
    shutil.rmtree(partial, ignore_errors=True)
    for rel in TRAIN_FILES:
        src, dst = Path(args.data_dir) / rel, partial / rel
        opener = lzma.open if src.suffix == ".xz" else open
        with opener(src, "rt", encoding="utf-8") as f:
            docs = f.read().split("\n\n")
        kept = "\n\n".join(docs[:max(1, round(len(docs) * args.fraction))])
        dst.parent.mkdir(parents=True, exist_ok=True)
        with opener(dst, "wt", encoding="utf-8") as f:
            f.write(kept)
        print(f"{rel}: {len(kept):,} of {sum(map(len, docs)):,} characters, {dst.stat().st_size:,} bytes")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)


if __name__ == "__main__":
    main()
