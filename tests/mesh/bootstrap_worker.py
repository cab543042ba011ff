"""Run by test_launch.py in each process of `accy launch`: the bootstrap without GPUs."""

import json
import os
import sys

import numpy as np

from accy.mesh import Mesh
from accy.mesh.bootstrap import Environment, Store, share_ids


def main() -> None:
    env = Environment.from_env()
    store = Store.connect(env, timeout=60)
    mesh = Mesh(np.arange(env.world_size).reshape(2, -1), ("data", "model"))
    ids = share_ids(store, mesh, env.rank, lambda: list(os.urandom(8)))
    store.barrier("done")
    with open(os.path.join(sys.argv[1], f"rank{env.rank}.json"), "w") as out:
        json.dump(
            {"rank": env.rank, "world": env.world_size, "local": env.local_rank, "ids": ids}, out
        )
    store.close()  # rank 0 serves the store: it stays until every rank has left


if __name__ == "__main__":
    main()
