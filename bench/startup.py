"""Memory and start-up: peak RSS of `rigkit ask`, time to first token, `Index.load` of 50k chunks.

Each measurement runs in a fresh process, as a user would meet it:

    rigkit ask       the demo question with the default model (CPU profile); peak resident
                     memory of the process (`wait4`'s ru_maxrss) and its wall time
    first token      a new Python process: imports, the default model (its converted copy cached
                     on disk, so this is a second start), the demo index, then one token of the
                     answer; each phase timed, twice (the first start may convert the model),
                     each right after the floor: a fresh process that loads the same cached
                     model with transformers alone and generates one token
    Index.load       the 50,000-chunk benchmark index (`bench/retrieval.py` builds it from its
                     cached vectors): open it, then the first and a second hybrid query (the first
                     one pays for reading the BM25 matrix and faiss file and loading MiniLM)

    python bench/startup.py [--quick]    # quick: a 2,000-chunk index, one first-token start
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import CPU_CONFIG, ROOT, demo_questions, parser, save, setup

PYTHON = sys.executable
THREADS = "2"  # torch threads of the child processes; main() sets it from --threads

FIRST_TOKEN = r"""
import json, sys, time
t0 = float(sys.argv[1]); marks = {"process_start": time.time() - t0}
import torch, transformers
import rigkit
from rigkit.build import build_controller, build_generator
from rigkit.config import load_config
marks["imports"] = time.time() - t0
generator = build_generator()
marks["model_loaded"] = time.time() - t0
config = load_config(sys.argv[2])
controller = build_controller(config, generator)
marks["index_opened"] = time.time() - t0
controller.context.start(sys.argv[3])
segment = generator.next_segment(controller.context.pieces(), controller.stop, 1)
marks["first_token"] = time.time() - t0
print(json.dumps({"marks": marks, "token": segment.text, "source": generator.source}))
"""

# The floor: what any program pays for the same cached model and one token, transformers alone.
FLOOR = r"""
import json, sys, time
t0 = float(sys.argv[1]); marks = {"process_start": time.time() - t0}
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
marks["imports"] = time.time() - t0
tokenizer = AutoTokenizer.from_pretrained(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(sys.argv[2]).eval()
marks["model_loaded"] = time.time() - t0
ids = tokenizer.apply_chat_template([{"role": "user", "content": sys.argv[3]}], add_generation_prompt=True,
                                    return_tensors="pt", return_dict=True)["input_ids"]
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=1, do_sample=False)
marks["first_token"] = time.time() - t0
print(json.dumps({"marks": marks, "token": tokenizer.decode(out[0, -1:])}))
"""

INDEX_LOAD = r"""
import json, sys, time
t0 = time.perf_counter()
from rigkit.retrieval import Index
imported = time.perf_counter() - t0
t = time.perf_counter(); index = Index.load(sys.argv[1]); load_s = time.perf_counter() - t
retriever = index.retriever("hybrid")
t = time.perf_counter(); retriever.search(sys.argv[2], 3); first_s = time.perf_counter() - t
t = time.perf_counter(); retriever.search(sys.argv[3], 3); second_s = time.perf_counter() - t
print(json.dumps({"chunks": len(index.chunks), "import_s": imported, "load_s": load_s,
                  "first_query_s": first_s, "second_query_s": second_s}))
"""


def child(args: list[str]) -> tuple[str, float, int]:
    """Run a command in a fresh process; return (stdout, wall seconds, that process's peak RSS
    in MiB). Output goes to files so that `wait4` can reap the child and report its own usage."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(args, stdout=out, stderr=err, text=True, cwd=ROOT,
                                env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": THREADS})
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode:
            tail = err.read().strip()[-400:]
            raise SystemExit(f"{' '.join(Path(a).name for a in args[:2])} failed ({proc.returncode}): {tail}")
        return out.read(), wall, round(usage.ru_maxrss / 1024)  # ru_maxrss is KiB on Linux


def rss_of_ask(question: str, config: Path) -> dict:
    """Peak RSS and wall time of `rigkit ask --json` (default model, CPU profile)."""
    rigkit = str(Path(PYTHON).with_name("rigkit"))
    out, wall, rss = child([rigkit, "ask", "--config", str(config), "--json", question])
    result = json.loads(out)
    return {"peak_rss_mib": rss, "wall_s": wall, "generated": result["tokens"]["generated"],
            "retrievals": result["used_retrieval_times"]}


def floor_token(question: str) -> dict:
    """A bare transformers load of the cached default model and one greedy token, fresh process."""
    from rigkit.generation.loading import converted_model_dir

    t0 = time.time()
    out, wall, _ = child([PYTHON, "-c", FLOOR, repr(t0), str(converted_model_dir()), question])
    marks = json.loads(out.strip().splitlines()[-1])["marks"]
    return {"time_to_first_token_s": marks["first_token"], "process_wall_s": wall,
            "phases": {"python_start_s": marks["process_start"],
                       "imports_s": marks["imports"] - marks["process_start"],
                       "model_load_s": marks["model_loaded"] - marks["imports"],
                       "first_token_s": marks["first_token"] - marks["model_loaded"]}}


def first_token(question: str, starts: int) -> list[dict]:
    """rigkit's start (imports, model, index, one token of the answer), `starts` times, each
    right after a floor start (`floor_token`), so the two see the same machine."""
    rows = []
    for _ in range(starts):
        floor = floor_token(question)
        t0 = time.time()
        out, wall, _ = child([PYTHON, "-c", FIRST_TOKEN, repr(t0), str(CPU_CONFIG), question])
        data = json.loads(out.strip().splitlines()[-1])
        marks = data["marks"]
        phases = {
            "python_start_s": marks["process_start"],
            "imports_s": marks["imports"] - marks["process_start"],
            "model_load_s": marks["model_loaded"] - marks["imports"],
            "index_open_s": marks["index_opened"] - marks["model_loaded"],
            "first_token_s": marks["first_token"] - marks["index_opened"],
        }
        rows.append({"time_to_first_token_s": marks["first_token"], "phases": phases,
                     "model_source": data["source"], "process_wall_s": wall, "floor": floor,
                     "over_floor": marks["first_token"] / floor["time_to_first_token_s"]})
    return rows


def index_load(path: Path, queries: list[str]) -> dict:
    out, wall, rss = child([PYTHON, "-c", INDEX_LOAD, str(path), queries[0], queries[1]])
    data = json.loads(out.strip().splitlines()[-1])
    return {**data, "process_wall_s": wall, "peak_rss_mib": rss, "path": str(path)}


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--index", type=Path, default=None,
                   help="the index to load (default: the benchmark index bench/retrieval.py saves)")
    args = p.parse_args(argv)
    setup(args)
    global THREADS
    import torch

    THREADS = str(torch.get_num_threads())
    started = time.perf_counter()
    question = demo_questions(1)[0]
    from retrieval import (
        bench_index_path,
        cached_chunk_count,
        ensure_bench_index,
        questions,
        window_chunks,
    )

    print("rigkit ask (default model, CPU profile): ", end="", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        config = CPU_CONFIG
        if args.quick:  # the same run with a 16-token answer: memory is the model's, not the answer's
            from rigkit.config import load_config

            config = Path(tmp) / "quick.yaml"
            config.write_text(load_config(CPU_CONFIG, generator={"max_answer_tokens": 16}).to_yaml())
        ask = rss_of_ask(question, config)
    print(f"peak RSS {ask['peak_rss_mib']} MiB, {ask['wall_s']:.1f} s, {ask['generated']} tokens, "
          f"{ask['retrievals']} retrievals", flush=True)
    starts = first_token(question, 1 if args.quick else 2)
    for i, s in enumerate(starts, start=1):
        ph = s["phases"]
        print(f"start {i}: first token after {s['time_to_first_token_s']:.2f} s (python {ph['python_start_s']:.2f}, "
              f"imports {ph['imports_s']:.2f}, model {ph['model_load_s']:.2f} [{s['model_source']}], "
              f"index {ph['index_open_s']:.2f}, first token {ph['first_token_s']:.2f})", flush=True)
        fl = s["floor"]["phases"]
        print(f"  floor (transformers alone, same model): {s['floor']['time_to_first_token_s']:.2f} s (imports "
              f"{fl['imports_s']:.2f}, model {fl['model_load_s']:.2f}, first token {fl['first_token_s']:.2f}): "
              f"rigkit x{s['over_floor']:.2f}", flush=True)
    wanted = 2000 if args.quick else 50_000
    n = wanted if args.index else max(2000, cached_chunk_count(window_chunks(wanted)))
    if n < wanted:  # embedding 50k chunks takes long on a busy machine: load what exists, say so
        print(f"only {n:,} of {wanted:,} chunks have cached vectors (bench/retrieval.py embeds the rest); "
              f"loading a {n:,}-chunk index", flush=True)
    path = args.index or ensure_bench_index(n, bench_index_path(n))
    qs = questions()
    loaded = index_load(path, [qs[0], qs[1]])
    print(f"Index.load of {loaded['chunks']:,} chunks: {1e3 * loaded['load_s']:.0f} ms; first hybrid query "
          f"{loaded['first_query_s']:.2f} s (reads BM25 + faiss, loads MiniLM), second "
          f"{1e3 * loaded['second_query_s']:.1f} ms; process peak RSS {loaded['peak_rss_mib']} MiB")
    save(args, "startup", {"ask": ask, "first_token": starts, "index_load": loaded, "index_chunks_wanted": wanted,
                           "second_start_ttft_s": starts[-1]["time_to_first_token_s"],
                           "second_start_over_floor": starts[-1]["over_floor"]}, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
