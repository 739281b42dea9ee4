"""Run the ``laquant`` CLI with one decode kernel's launch at its bucket of the most programs (B = 64) set:
``KERNEL:FORMAT:BKxW[p]`` (``p``: the walk loads each next block ahead), e.g. to time a launch end to end against
another in one job without editing the tables (issue #14, ``eval/results/decode_prefetch_h200/``).

    python3 tools/with_decode_launch.py ssd:int8_row:16x1p eval speed --suite e2e ...
"""
import sys

from probe_decode_prefetch import parse_launch, tabled


def main() -> int:
    kernel, fmt, launch = sys.argv[1].split(":")
    if fmt != "int8_row":
        raise SystemExit(f"only the int8 state's launches are set here, not {fmt!r}")
    from laquant.cli import main as cli

    with tabled(kernel, parse_launch(launch)):
        return cli(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
