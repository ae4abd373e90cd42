"""`rigkit serve` under load: latency and throughput, one client alone vs many at once.

Starts `rigkit serve` (CPU profile, a bounded queue; the in-process model on one worker, or with
`--set generator.backend=openai --set generator.base_url=URL` a served model such as vLLM on
the backend's default of several workers, `--workers N` to choose) on a free loopback port, then
    alone    one client asks the questions one after another
    load     C concurrent clients x Q questions each; a 429 is retried after its `Retry-After`
and prints p50 / p95 latency (a client's wall time per answer, queueing and retries included),
throughput (answers per second), the 429 count, the ratios load / alone, and how many answers
under load are identical to the same question's answer alone (greedy decoding: all should be).
Every question must end with exactly one answer: a lost or failed request is an error, not a
statistic.

Under load each client asks the next question as soon as its last is answered; 4 clients x 2
questions are the 8 demo questions once each, as alone (`--dataset SET`: that set's test split
over its corpus, every question once in each phase). Against vLLM (`--vllm` starts one with the
tests' venv and flags, or `--set generator.base_url=...`), `--vllm` empties vLLM's prefix cache
before each phase, so neither phase reads what the other put there (vLLM's `/reset_prefix_cache`,
served with `VLLM_SERVER_DEV_MODE=1`).

First, time to first token with one client: a streamed `/chat` (the first `token` event) beside
the loop `rigkit ask` runs, in this process with the same config and model, both warm, taking
turns question by question (the server idles while the loop runs).

    python bench/serve.py            # 16 clients x 3 questions, 24-token answers: the figures in docs/serving.md
    python bench/serve.py --quick    # 4 clients x 2 questions, 8-token answers (~a minute)
    python bench/serve.py --vllm --clients 4 --questions 2 --workers 4 --no-first-token
                                     # vLLM on this CPU, started and stopped here (docs/serving.md)
    python bench/serve.py --clients 4 --set generator.backend=openai \
        --set generator.base_url=http://127.0.0.1:8000/v1 ...   # a vLLM server already running
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
from common import ROOT, save


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 clients x 2 questions, 8-token answers")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--questions", type=int, default=3, help="questions per client")
    p.add_argument("--max-tokens", type=int, default=24, help="answer token limit per question")
    p.add_argument("--max-queue", type=int, default=8, help="the server's queue bound")
    p.add_argument("--url", help="an already running server instead of starting one")
    p.add_argument("--workers", type=int, help="the server's loops at once (default: the backend's)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                   help="a config setting for the server and the in-process loop, as `rigkit --set` takes it")
    p.add_argument("--no-first-token", action="store_true", help="skip the first-token comparison")
    p.add_argument("--vllm", action="store_true",
                   help="start vLLM (the tests' venv and flags) for the server's generator, cache emptied per phase")
    p.add_argument("--dataset", choices=("2wikimultihopqa", "musique"),
                   help="ask this set's test questions over its corpus instead of the demo's 8")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where the JSON goes (default: bench/results, quick: bench/results/quick)")
    args = p.parse_args()
    started = time.perf_counter()
    if args.quick:
        args.clients, args.questions, args.max_tokens = 4, 2, 8
    questions = [json.loads(line)["question"] for line in (ROOT / "data/demo/questions.jsonl").open()]
    if args.dataset:  # its test split over its own corpus, every question once in each phase
        from common import test_questions

        questions = [item.question for item in test_questions(args.dataset)]
        args.settings = [f"retrieval.corpus={ROOT / 'data' / args.dataset / 'corpus.jsonl'}", *args.settings]
    # a terminated benchmark must not leave its server running: SIGTERM unwinds like Ctrl-C
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with ExitStack() as stack:
        fresh = None
        if args.vllm:
            vllm = stack.enter_context(_vllm())
            args.settings += ["generator.backend=openai", f"generator.base_url={vllm}/v1"]
            fresh = lambda: httpx.post(f"{vllm}/reset_prefix_cache", timeout=60).raise_for_status()  # noqa: E731
        return _bench(args, questions, fresh, started)


def _vllm():
    """vLLM on a free port with the tests' flags and its dev routes (the prefix-cache reset)."""
    from rigkit.build import build_generator
    from rigkit.generation import converted_model_dir
    from tests import vllm_setup  # the vLLM venv and flags the tests use

    build_generator()  # the converted folder vLLM reads
    log = Path(tempfile.mkdtemp(prefix="rigkit-bench-vllm-")) / "vllm.log"
    print(f"starting vLLM (log: {log})", flush=True)
    return vllm_setup.running(converted_model_dir(), log, extra_env={"VLLM_SERVER_DEV_MODE": "1"})


def _bench(args: argparse.Namespace, questions: list[str], fresh, started: float) -> int:
    server = None if args.url else _start(args.max_queue, args.workers, args.settings)
    base = args.url or server[0]
    try:
        health = httpx.get(f"{base}/health", timeout=10).json()
        load_total = len(questions) if args.dataset else args.clients * args.questions
        print(f"server {base}  {health.get('workers', 1)} workers  {args.clients} clients, {load_total} "
              f"answers under load ({args.dataset or 'demo'} questions), max_tokens {args.max_tokens}, queue bound {args.max_queue}, {os.cpu_count()} cores, "
              f"load average {os.getloadavg()[0]:.1f}" + "".join(f"  --set {s}" for s in args.settings))
        options = {"max_tokens": args.max_tokens}
        _ask(base, questions[0], options)  # warm-up (first-call allocations), not counted
        first = None if args.no_first_token else _first_tokens(
            base, [q for q in questions if q.isascii()][:2 if args.quick else 4], options, args.settings)
        alone = _run(base, questions, options, clients=1, total=len(questions), fresh=fresh)
        load = _run(base, questions, options, clients=args.clients, total=load_total, fresh=fresh)
    finally:
        if server is not None:
            server[1].terminate()
            server[1].wait(60)
    same = sum(load["answers_by_question"][q] == [alone["answers_by_question"][q][0]] * len(load["answers_by_question"][q])
               for q in load["answers_by_question"])
    record = _report(alone, load, first, same, health.get("workers", 1),
                     {"settings": args.settings, "vllm": args.vllm, "max_tokens": args.max_tokens,
                      "questions": f"{args.dataset} test" if args.dataset else "demo"})
    save(args, "serve_vllm" if args.vllm else "serve", record, started)
    return 0


def _first_tokens(base: str, questions: list[str], options: dict, settings: list[str]) -> dict:
    """Seconds to the first token: streamed `/chat` vs `rigkit ask`'s loop in this process."""
    from rigkit.build import build_controller, build_generator
    from rigkit.config import apply_settings, load_config

    config = apply_settings(load_config(ROOT / "configs/cpu.yaml"), settings)
    config = config.override(generator={"max_answer_tokens": options["max_tokens"]})
    controller = build_controller(config, build_generator(config.generator))

    class FirstToken:
        def on_token(self, text: str) -> None:
            if self.at is None:
                self.at = time.perf_counter()

    def in_process(question: str) -> float:
        first = FirstToken()
        first.at, controller.callbacks = None, [first]
        start = time.perf_counter()
        controller.run(question)
        return first.at - start

    def streamed(question: str) -> float:
        start = time.perf_counter()
        with httpx.Client(timeout=600) as http, http.stream(
                "POST", f"{base}/chat", json={"question": question, "options": options, "stream": True}) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line == "event: token":
                    return time.perf_counter() - start
        raise RuntimeError(f"no token streamed for {question!r}")

    in_process(questions[0])  # warm-up of this process's copy
    ask, chat = [], []
    for question in questions:
        ask.append(in_process(question))
        chat.append(streamed(question))
    return {"questions": len(questions), "ask_s": ask, "chat_s": chat,
            "ask_p50": statistics.median(ask), "chat_p50": statistics.median(chat),
            "chat_vs_ask": statistics.median(chat) / statistics.median(ask)}


def _start(max_queue: int, workers: int | None, settings: list[str]) -> tuple[str, subprocess.Popen]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "rigkit.cli", "serve", "--config", str(ROOT / "configs/cpu.yaml"),
                             "--port", str(port), "--max-queue", str(max_queue),
                             *(["--workers", str(workers)] if workers else []),
                             *[arg for setting in settings for arg in ("--set", setting)]],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"rigkit serve exited:\n{log.read().decode()[-2000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return base, proc
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("rigkit serve did not start in 300 s")


def _ask(base: str, question: str, options: dict) -> tuple[float, int, str]:
    """(seconds until the answer, 429s met on the way, the answer); retries after `Retry-After`."""
    refused, start = 0, time.perf_counter()
    with httpx.Client(timeout=600) as http:
        while True:
            r = http.post(f"{base}/chat", json={"question": question, "options": options})
            if r.status_code == 429:
                refused += 1
                time.sleep(min(float(r.headers.get("retry-after", "1")), 5.0))
                continue
            r.raise_for_status()
            answer = r.json()["answer"]
            if not answer.strip():
                raise RuntimeError(f"an empty answer to {question!r}")
            return time.perf_counter() - start, refused, answer


def _run(base: str, questions: list[str], options: dict, clients: int, total: int, fresh=None) -> dict:
    """`clients` at once asking `total` questions (the list in order, from the start again when it
    runs out), each client taking the next one as soon as its last is answered, as a load generator
    with a fixed concurrency does. `fresh()`: empties the server's prefix cache first."""
    lock, latencies, refusals, answers = threading.Lock(), [], [0], {}
    todo = iter([questions[k % len(questions)] for k in range(total)])
    if fresh is not None:
        fresh()

    def client(_: int) -> None:
        while True:
            with lock:
                question = next(todo, None)
            if question is None:
                return
            seconds, refused, answer = _ask(base, question, options)
            with lock:
                latencies.append(seconds)
                refusals[0] += refused
                answers.setdefault(question, []).append(answer)

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))  # re-raises the first failure
    wall = time.perf_counter() - start
    expected = total
    if len(latencies) != expected:
        raise RuntimeError(f"{expected - len(latencies)} of {expected} questions got no answer")
    latencies.sort()
    return {"clients": clients, "answers": expected, "wall_s": wall, "throughput": expected / wall,
            "p50": statistics.median(latencies), "p95": latencies[max(0, round(0.95 * len(latencies)) - 1)],
            "refused": refusals[0], "answers_by_question": answers}


def _report(alone: dict, load: dict, first: dict | None, same: int, workers: int, setting: dict) -> dict:
    if first is not None:
        print(f"first token, one client ({first['questions']} questions): streamed /chat p50 "
              f"{first['chat_p50']:.2f} s, rigkit ask's loop {first['ask_p50']:.2f} s: x{first['chat_vs_ask']:.2f}")
    print(f"{'':10}{'clients':>8}{'answers':>8}{'p50 s':>8}{'p95 s':>8}{'answers/s':>11}{'429s':>6}")
    for name, r in (("alone", alone), ("load", load)):
        print(f"{name:10}{r['clients']:>8}{r['answers']:>8}{r['p50']:>8.2f}{r['p95']:>8.2f}"
              f"{r['throughput']:>11.2f}{r['refused']:>6}")
    why = (" (one model, one worker: throughput stays flat and the wait grows with the queue)"
           if workers == 1 else f" ({workers} workers)")
    asked = len(load["answers_by_question"])
    print(f"load / alone: p50 x{load['p50'] / alone['p50']:.1f}, p95 x{load['p95'] / alone['p95']:.1f}, "
          f"throughput x{load['throughput'] / alone['throughput']:.2f}{why}; nothing lost; "
          f"answers under load identical to alone: {same} of {asked} questions")
    return {"alone": alone, "load": load, "first_token": first, "workers": workers, **setting,
            "answers_identical": same, "questions_asked": asked}

if __name__ == "__main__":
    sys.exit(main())
