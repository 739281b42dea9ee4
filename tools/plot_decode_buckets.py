"""The decode launch sweep (tools/sweep_kernels.py state_decode's JSON lines) as a plot: per kernel and state format,
microseconds against the batch for the launch the table picks, the fastest swept, and a fixed launch
(one warp walking 16 rows: what every batch took before the table had buckets).

    python3 tools/plot_decode_buckets.py SWEEP.jsonl OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from laquant.kernels.common.state_io import bucket_launch, decode_table  # noqa: E402

FIXED = (16, 1)


def main(sweep, out):
    timed, devices = {}, set()
    for line in open(sweep):
        row = json.loads(line)
        devices.add(row.get("device"))
        key = (row["kernel"], row["format"].partition(":")[0])
        timed.setdefault(key, {}).setdefault((row["B"], row["programs"]), {})[row["block_k"], row["num_warps"]] = (
            row["us"])
    keys = sorted(timed)
    if len(devices) > 1:
        raise SystemExit(f"{sweep} holds rows of several GPUs ({sorted(map(str, devices))}): plot one GPU's sweep")
    gpu = devices.pop()  # the table that GPU takes (None, rows that do not name it: the first GPU's)
    fig, axes = plt.subplots(3, 4, figsize=(16, 10), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        points = sorted(timed[key])
        batches = [b for b, _ in points]
        table = [timed[key][p].get(bucket_launch(decode_table(key[0], gpu)[key[1]], p[1])) for p in points]
        ax.plot(batches, [min(timed[key][p].values()) for p in points], "k:", label="fastest swept")
        ax.plot(batches, [timed[key][p].get(FIXED) for p in points], "o-", label=f"block_k, warps = {FIXED}")
        ax.plot(batches, table, "s-", label="the table's launch")
        ax.set(xscale="log", yscale="log", title=f"{key[0]} decode, {key[1]} state", xlabel="batch (sequences)",
               ylabel="us per step")
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.legend(fontsize=7)
    for ax in axes.flat[len(keys):]:
        ax.axis("off")
    fig.suptitle("Decode step per launch, CUDA-graph medians (GLA 16x64x128, delta 32x128x128, SSD 64x128x64 heads)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:])
