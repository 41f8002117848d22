"""Start-up of a multi-node run: the SFT warm-up cache under torch.distributed; used by tests/test_multinode.py.

    torchrun ... tests/multinode_worker.py --cache_dir DIR --out result-{rank}.json

Every rank calls `prepare_sft_model(DIR, ...)` (a few SFT steps) and writes {"rank", "path", "files"} or
{"rank", "error"} as JSON to --out (with {rank} replaced).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache_dir", required=True)
    parser.add_argument("--out", required=True)
    a = parser.parse_args(argv)

    import torch.distributed as dist

    from stabledrl_trl.sft import prepare_sft_model

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        path = prepare_sft_model(a.cache_dir, seed=0, num_samples=64, max_steps=2, batch_size=8, progress=False)
        result = {"rank": rank, "path": os.path.abspath(path), "files": sorted(os.listdir(path))}
    except RuntimeError as err:
        result = {"rank": rank, "error": str(err)}
    with open(a.out.replace("{rank}", str(rank)), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
