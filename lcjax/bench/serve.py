"""``lcjax bench serve``: a bounded load benchmark of ``lcjax serve`` on 127.0.0.1.

A tiny random byte model (:func:`bench_model`) is served in this process (uvicorn in a
daemon thread, :class:`lcjax.serve.ServeLimits` defaults; with ``precompile`` the greedy
shapes of the workload are compiled at startup, ``create_app(precompile=...)``, and
``startup_s`` includes that); ``clients`` threads
send greedy completions (prompts of random printable bytes, ``prompt_min..prompt_max`` long,
``max_tokens`` each) back to back:

1. warm-up: ``warmup`` requests (compiles the padded shapes; not measured);
2. measured: at most ``requests`` requests and ``max_seconds`` seconds (a client stops
   sending once either is reached); 0.1 s in, one request with ``flood_prompts`` prompts
   is sent while the load runs (it must be refused: a 400, and quickly).

Reports per phase: requests, errors by status, latency p50 / p95 / max (s), requests/s,
completion tokens/s; the process's RSS (MiB, ``/proc/self/statm``) after loading the model,
after the warm-up and at the end; the compiled shapes and compile-cache clears; the flood
request's status and seconds. Everything is bounded in count and time; the server stops
by itself at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import numpy as np

from lcjax.agents.scripted import ThreadedServer

__all__ = ["add_arguments", "bench_model", "percentile", "rss_mib", "run_cli",
           "run_serve_benchmark"]


def rss_mib() -> float:
    """This process's resident set size in MiB (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def percentile(values, q: float) -> float | None:
    """The ``q``-th percentile (linear interpolation) of ``values``; None when empty."""
    return float(np.percentile(np.asarray(values, np.float64), q)) if len(values) else None


def bench_model(*, d_model: int = 64, num_layers: int = 2, max_len: int = 256, seed: int = 0):
    """A random-weight byte-vocabulary ``DecoderLM`` (4 heads) for the benchmark."""
    from flax import nnx

    from lcjax.data import tokenizer as tok
    from lcjax.nn import DecoderConfig, DecoderLM

    cfg = DecoderConfig(vocab_size=tok.VOCAB_SIZE, d_model=d_model, num_layers=num_layers,
                        num_heads=4, num_kv_heads=4, head_dim=d_model // 4,
                        mlp_hidden=4 * d_model, max_len=max_len)
    return DecoderLM(cfg, rngs=nnx.Rngs(seed))


def _server(app) -> ThreadedServer:
    """``app`` on a free 127.0.0.1 port; startup may compile the precompiled shapes."""
    return ThreadedServer(app, start_timeout=300, timeout_graceful_shutdown=10)


def _load(url: str, *, clients: int, requests_cap: int, max_seconds: float, prompts,
          max_tokens: int, timeout: float) -> dict:
    """``clients`` threads sending completions until ``requests_cap`` or ``max_seconds``."""
    import requests

    lock = threading.Lock()
    issued = [0]
    latencies, statuses, tokens = [], {}, [0]
    end = time.monotonic() + max_seconds

    def client(c: int):
        with requests.Session() as session:
            while True:
                with lock:
                    if issued[0] >= requests_cap or time.monotonic() >= end:
                        return
                    k = issued[0]
                    issued[0] += 1
                body = {"prompt": prompts[k % len(prompts)], "max_tokens": max_tokens,
                        "temperature": 0}
                t0 = time.monotonic()
                try:
                    r = session.post(url + "/v1/completions", json=body, timeout=timeout)
                    status = r.status_code
                    used = r.json().get("usage", {}).get("completion_tokens", 0) \
                        if status == 200 else 0
                except requests.RequestException as e:
                    status, used = type(e).__name__, 0
                took = time.monotonic() - t0
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1
                    if status == 200:
                        latencies.append(took)
                        tokens[0] += used

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max_seconds + timeout + 5)
    wall = time.monotonic() - t0
    ok = len(latencies)
    return {"requests": sum(statuses.values()), "ok": ok,
            "statuses": {str(k): v for k, v in sorted(statuses.items(), key=str)},
            "wall_s": wall, "p50_s": percentile(latencies, 50),
            "p95_s": percentile(latencies, 95),
            "max_s": max(latencies) if latencies else None,
            "requests_per_s": ok / wall if wall else None,
            "completion_tokens_per_s": tokens[0] / wall if wall else None}


def _flood(url: str, n: int, delay: float, out: dict) -> None:
    import requests

    time.sleep(delay)
    t0 = time.monotonic()
    try:
        r = requests.post(url + "/v1/completions", timeout=60,
                          json={"prompt": ["x" * 8] * n, "max_tokens": 4, "temperature": 0})
        out["status"] = r.status_code
    except requests.RequestException as e:
        out["status"] = type(e).__name__
    out["seconds"] = time.monotonic() - t0
    out["prompts"] = n


def run_serve_benchmark(*, clients: int = 8, requests: int = 400, warmup: int = 64,
                        max_seconds: float = 60.0, prompt_min: int = 16,
                        prompt_max: int = 120, max_tokens: int = 16, max_batch: int = 8,
                        batch_window_ms: float = 10.0, flood_prompts: int = 20_000,
                        d_model: int = 64, num_layers: int = 2, max_len: int = 256,
                        seed: int = 0, timeout: float = 60.0,
                        precompile: bool = True) -> dict:
    """Runs the benchmark (module docstring); returns the figures as a JSON-able dict."""
    for name, value in (("clients", clients), ("requests", requests),
                        ("max_tokens", max_tokens), ("prompt_min", prompt_min)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"bench serve: `{name}` must be an int >= 1, got {value!r}")
    if not prompt_min <= prompt_max or prompt_max + 1 + max_tokens > max_len:
        raise ValueError(f"bench serve: need prompt_min <= prompt_max and prompt_max + 1 + "
                         f"max_tokens <= max_len, got {prompt_min}, {prompt_max}, "
                         f"{max_tokens}, {max_len}")
    if not 0 < max_seconds <= 600:
        raise ValueError(f"bench serve: `max_seconds` must lie in (0, 600], got {max_seconds}")
    from lcjax.serve import ByteTokenizer, ServedModel, create_app

    rss_start = rss_mib()
    model = bench_model(d_model=d_model, num_layers=num_layers, max_len=max_len, seed=seed)
    rng = np.random.default_rng(seed)
    prompts = ["".join(chr(c) for c in rng.integers(32, 127, rng.integers(prompt_min,
                                                                          prompt_max + 1)))
               for _ in range(256)]
    app = create_app(ServedModel(model, ByteTokenizer(), "bench", max_len),
                     batch_window_ms=batch_window_ms, max_batch=max_batch,
                     precompile=(prompt_max + 1, max_tokens) if precompile else None)
    result = {"config": {"clients": clients, "requests": requests, "warmup": warmup,
                         "max_seconds": max_seconds, "prompt_bytes": [prompt_min, prompt_max],
                         "max_tokens": max_tokens, "max_batch": max_batch,
                         "batch_window_ms": batch_window_ms, "flood_prompts": flood_prompts,
                         "precompile": precompile,
                         "model": {"d_model": d_model, "num_layers": num_layers,
                                   "max_len": max_len}},
              "rss_mib": {"start": rss_start}}
    t0 = time.monotonic()
    with _server(app) as server:
        result["startup_s"] = time.monotonic() - t0  # the precompile included
        result["rss_mib"]["served"] = rss_mib()
        load = dict(clients=clients, prompts=prompts, max_tokens=max_tokens, timeout=timeout)
        if warmup:
            result["warmup"] = _load(server.url, requests_cap=warmup, max_seconds=max_seconds,
                                     **load)
        result["rss_mib"]["after_warmup"] = rss_mib()
        flood: dict = {}
        flooder = threading.Thread(target=_flood, daemon=True,
                                   args=(server.url, flood_prompts, 0.1, flood))
        if flood_prompts:
            flooder.start()
        result["measured"] = _load(server.url, requests_cap=requests, max_seconds=max_seconds,
                                   **load)
        if flood_prompts:
            flooder.join(60)
            result["flood"] = flood
        stats = app.state.batcher.stats
        result["compiled"] = {"distinct_shapes": len(set(stats.shapes)),
                              "cache_clears": stats.cache_clears,
                              "generate_calls": stats.generate_calls,
                              "mean_batch": float(np.mean(stats.batch_sizes))
                              if stats.batch_sizes else None}
        result["rss_mib"]["end"] = rss_mib()
    return result


def format_summary(result: dict) -> str:
    """A few lines for the terminal (and docs/serve.md)."""
    m, r = result["measured"], result["rss_mib"]
    f = lambda x: "-" if x is None else f"{x:.3f}"
    lines = [f"measured: {m['ok']}/{m['requests']} ok {m['statuses']} in {m['wall_s']:.1f} s; "
             f"latency p50 {f(m['p50_s'])} s, p95 {f(m['p95_s'])} s, max {f(m['max_s'])} s; "
             f"{f(m['requests_per_s'])} req/s, {f(m['completion_tokens_per_s'])} tokens/s",
             f"RSS MiB: start {r['start']:.0f}, served {r['served']:.0f}, after warm-up "
             f"{r['after_warmup']:.0f}, end {r['end']:.0f}",
             f"compiled: {result['compiled']}; startup {result['startup_s']:.1f} s"]
    if "flood" in result:
        fl = result["flood"]
        lines.append(f"flood: {fl.get('prompts')} prompts -> {fl.get('status')} in "
                     f"{fl.get('seconds', float('nan')):.3f} s")
    return "\n".join(lines)


def add_arguments(sub) -> None:
    """Registers ``lcjax bench serve`` on the ``bench`` subparsers ``sub``."""
    p = sub.add_parser("serve", help="bounded load benchmark of lcjax serve on 127.0.0.1 "
                       "(latency p50/p95, throughput, RSS)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--clients", type=int, default=8, help="concurrent client threads")
    p.add_argument("--requests", type=int, default=400, help="measured requests at most")
    p.add_argument("--warmup", type=int, default=64, help="unmeasured requests first")
    p.add_argument("--max-seconds", type=float, default=60.0,
                   help="each phase stops sending after this long (<= 600)")
    p.add_argument("--prompt-min", type=int, default=16, help="shortest prompt, bytes")
    p.add_argument("--prompt-max", type=int, default=120, help="longest prompt, bytes")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--batch-window-ms", type=float, default=10.0)
    p.add_argument("--flood-prompts", type=int, default=20_000,
                   help="one request with this many prompts during the load (0: none)")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precompile", action=argparse.BooleanOptionalAction, default=True,
                   help="compile the workload's greedy shapes at startup")
    p.add_argument("--out", default=None, help="write the figures as JSON here")


def run_cli(args: argparse.Namespace) -> int:
    """Runs ``lcjax bench serve``; prints the summary and the JSON; 0 on completion."""
    from lcjax.bench.timing import json_default, machine_info

    load_before = os.getloadavg()
    result = run_serve_benchmark(
        clients=args.clients, requests=args.requests, warmup=args.warmup,
        max_seconds=args.max_seconds, prompt_min=args.prompt_min, prompt_max=args.prompt_max,
        max_tokens=args.max_tokens, max_batch=args.max_batch,
        batch_window_ms=args.batch_window_ms, flood_prompts=args.flood_prompts,
        d_model=args.d_model, num_layers=args.num_layers, max_len=args.max_len,
        seed=args.seed, precompile=args.precompile)
    result["machine"] = machine_info()
    result["load_average"] = {"before": load_before, "after": os.getloadavg()}
    print(format_summary(result))
    text = json.dumps(result, default=json_default, indent=1)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0
