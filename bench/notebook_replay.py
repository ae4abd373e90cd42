"""Notebook start-to-end times: replay (saved runs, no model) against live (the model runs).

Each notebook runs top to bottom in a real Jupyter kernel (nbclient), as the notebook tests do,
once with RIGKIT_REPLAY=1 and, unless --replay-only, once with RIGKIT_REPLAY=0. Printed: seconds
each way, live / replay, and replay against the classroom goal of 60 s per notebook. Notebooks
without a replay switch (04, 09: no generator) run the same code both ways (ratio ~1).

    python bench/notebook_replay.py                       # every notebook, both ways
    python bench/notebook_replay.py --replay-only 01 02   # names by prefix
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402  (puts the repository on sys.path, keeps the hub offline)

NOTEBOOKS = common.ROOT / "notebooks"
GOAL_S = 60.0


def execute(path: Path, replay: bool, timeout: int) -> float:
    """Seconds to run `path` in a fresh kernel with RIGKIT_REPLAY set; raises on a cell error."""
    import nbformat
    from nbclient import NotebookClient

    os.environ["RIGKIT_REPLAY"] = "1" if replay else "0"
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__)
    p.add_argument("names", nargs="*", help="notebook name prefixes (default: all)")
    p.add_argument("--replay-only", action="store_true", help="skip the live runs")
    p.add_argument("--timeout", type=int, default=900, help="per-cell limit in seconds")
    args = p.parse_args(argv)
    started = time.perf_counter()
    paths = sorted(q for q in NOTEBOOKS.glob("*.ipynb")
                   if not args.names or any(q.name.startswith(n) for n in args.names))
    if args.quick:
        paths = paths[:1]
    rows = []
    print(f"{'notebook':34} {'replay s':>9} {'live s':>8} {'live/replay':>12} {'replay/goal':>12}")
    for path in paths:
        replay_s = execute(path, True, args.timeout)
        live_s = None if args.replay_only or args.quick else execute(path, False, args.timeout)
        ratio = f"{live_s / replay_s:.1f}x" if live_s else "–"
        print(f"{path.stem:34} {replay_s:9.1f} {live_s if live_s else float('nan'):8.1f} {ratio:>12} "
              f"{replay_s / GOAL_S:11.2f}x", flush=True)
        rows.append({"notebook": path.stem, "replay_s": replay_s, "live_s": live_s})
    common.save(args, "notebook_replay", {"goal_s": GOAL_S, "rows": rows}, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
