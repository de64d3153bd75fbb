"""What polling for interruption notices costs a training step: a small training loop on CPU timed with
the watcher off, polling at its production interval (5 s), and polling 100 times as often (every 0.05 s,
the shortest interval allowed), against an AWS-like metadata endpoint on 127.0.0.1, in a process of its
own, that has no notice (a token by PUT, 404 on the GETs).
The three run in turns, rounds interleaved; the figure is the median step time of each, and its ratio to
the watcher off.

    .venv/bin/python bench/notices.py [--steps 400] [--rounds 5]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from entrypoint.notices import watching_notices


class _NoNotice(BaseHTTPRequestHandler):
    requests = None  # a multiprocessing.Value shared with the benchmark's process

    def log_message(self, *args):
        pass

    def _answer(self, status: int, body: bytes = b"") -> None:
        with self.requests.get_lock():
            self.requests.value += 1
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        self._answer(200, b"token")

    def do_GET(self):
        self._answer(404)


def _serve(port, requests) -> None:
    _NoNotice.requests = requests
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoNotice)
    port.value = server.server_address[1]
    server.serve_forever()


def _steps(count: int) -> list[float]:
    """Per-step seconds of a 3-layer MLP (1024 wide, batch 64) trained with AdamW on CPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 16)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(64, 1024), torch.randint(0, 16, (64,))
    times = []
    for _ in range(count):
        started = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    # The endpoint in a process of its own, as the provider's is: its work does not count against the steps.
    spawn = multiprocessing.get_context("spawn")
    port, requests = spawn.Value("i", 0), spawn.Value("l", 0)
    server = spawn.Process(target=_serve, args=(port, requests), daemon=True)
    server.start()
    while not port.value:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port.value}"
    configs = {
        "off": {"RENTUNE_INTERRUPTION_NOTICE": "off"},
        "every 5 s": {"RENTUNE_INTERRUPTION_NOTICE": "aws", "RENTUNE_METADATA_URL": url},
        "every 0.05 s": {
            "RENTUNE_INTERRUPTION_NOTICE": "aws",
            "RENTUNE_METADATA_URL": url,
            "RENTUNE_NOTICE_POLL_SECONDS": "0.05",
        },
    }
    _steps(50)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in configs}
    served: dict[str, int] = dict.fromkeys(configs, 0)
    seconds: dict[str, float] = dict.fromkeys(configs, 0.0)
    names = list(configs)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:  # each goes first in turn
            before, started = requests.value, time.perf_counter()
            with watching_notices(lambda line: None, configs[name]):
                times[name] += _steps(args.steps)
            seconds[name] += time.perf_counter() - started
            served[name] += requests.value - before
    server.terminate()
    base = statistics.median(times["off"])
    print(f"{args.rounds} rounds x {args.steps} steps of a 1024-wide MLP on CPU ({torch.get_num_threads()} threads)")
    print(f"{'watcher':<14}{'median step':>14}{'ratio':>8}{'requests/s':>12}")
    for name in names:
        median = statistics.median(times[name])
        rate = served[name] / seconds[name]
        print(f"{name:<14}{median * 1000:>11.2f} ms{median / base:>8.3f}{rate:>12.1f}")


if __name__ == "__main__":
    main()
