"""Run by test_launch.py in each process of `accy launch`: the ranks meet at rank 0's store
before each step, as ranks meet in a collective. Modes (argv[2], joined by '+'): `die`: rank 1
exits with status 7 in the middle of the run, leaving the others blocked at the next meeting;
`stubborn`: rank 0 ignores SIGTERM (as a process stuck in a native call may); `block`: after the
steps every rank waits for a key no one sets (until the launcher stops it). Each rank writes its
pid to argv[1]/pid<rank> first (so the test can check that none is left running) and, with
`block`, argv[1]/blocked<rank> when it blocks."""

import os
import signal
import sys

from accy.mesh.bootstrap import Environment, Store


def main() -> None:
    folder, modes = sys.argv[1], sys.argv[2].split("+")
    env = Environment.from_env()
    with open(os.path.join(folder, f"pid{env.rank}"), "w") as out:
        out.write(str(os.getpid()))
    if "stubborn" in modes and env.rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    store = Store.connect(env, timeout=60)
    for step in range(3):
        store.barrier(f"step{step}")
        if "die" in modes and env.rank == 1 and step == 1:
            os._exit(7)
    if "block" in modes:
        open(os.path.join(folder, f"blocked{env.rank}"), "w").close()
        store.get("no process sets this")
    store.close()


if __name__ == "__main__":
    main()
