"""``lcjax eval``: evaluate a model folder or an OpenAI-compatible endpoint on a suite.

    lcjax eval --suite ruler --model runs/a --lengths 1k,2k,4k --out reports/eval_a
    lcjax eval --suite mgal --model runs/a --langs en,de,ja --lengths 8k,16k --depths 0,0.5,1 \\
        --out reports/mgal_a
    lcjax eval --suite nolima --endpoint http://127.0.0.1:8000 --api-model m --chat \\
        --concurrency 8 --lengths 4k --out out/ --resume

Writes ``OUT/results.jsonl`` (one record per finished item; ``--resume`` skips those),
``OUT/results.json``, ``OUT/results.md`` and ``OUT/<task>_heatmap.png``, and prints the
overall scores as JSON.

Suites plug in without special cases here (``lcjax.data.suites``): the flags a suite
declares (``register_suite(..., options=...)``, e.g. mgal's ``--langs``) are added to the
parser and passed to its factory, and a suite with a ``report`` hook writes its own files
into ``OUT`` (mgal: the granularity × position × language grid of MGAL's metrics); its
summary is printed under the suite's name.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from lcjax.attention.options import attention_options_arg
from lcjax.data.items import DEFAULT_DEPTHS, parse_depths, parse_lengths
from lcjax.data.model_tokenizers import HFTokenizer
from lcjax.data.suites import get_suite, suite_options
from lcjax.eval.endpoint import EndpointConfig
from lcjax.eval.evaluate import evaluate
from lcjax.eval.report import write_report
from lcjax.reporting import command_line, machine_info


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``lcjax eval`` flags to ``parser``."""
    parser.add_argument("--suite", required=True, help="registered suite: ruler, nolima, ...")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--model", help="run folder of `lcjax train --out DIR` or a Hugging "
                        "Face checkpoint folder (prompts encoded, and --lengths counted, in "
                        "its tokenizer)")
    target.add_argument("--endpoint", help="base URL of an OpenAI-compatible server")
    parser.add_argument("--lengths", type=parse_lengths, required=True,
                        help="comma list of lengths in tokens, k = 1024 (e.g. 1k,2k,4k)")
    parser.add_argument("--depths", type=parse_depths, default=DEFAULT_DEPTHS,
                        help="comma list of needle depths in [0, 1] (default "
                        f"{','.join(f'{d:g}' for d in DEFAULT_DEPTHS)})")
    parser.add_argument("--n-per-cell", type=int, default=4, help="items per task, length, depth")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", type=_names, default=None, help="comma list (default: all)")

    extra = parser.add_argument_group("suite options (passed to the suite's factory)")
    for opt in suite_options():
        extra.add_argument(opt.flag, dest=opt.dest, type=opt.type, default=None, help=opt.help)
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--resume", action="store_true",
                        help="skip the items already in OUT/results.jsonl")
    parser.add_argument("--no-retry-errors", dest="retry_errors", action="store_false",
                        help="with --resume, keep items recorded with an error")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="default: the longest answer + 16")
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    parser.add_argument("--allow-errors", action="store_true",
                        help="exit 0 even when items failed (default: exit 1 after a summary)")
    m = parser.add_argument_group("model (--model)")
    m.add_argument("--attention", default=None, help="attention variant for decoding "
                   "(default: the trained one; e.g. blockwise)")
    m.add_argument("--attention-options", type=attention_options_arg, default=None, metavar="JSON",
                   help="the variant's options as a JSON object (or @FILE), e.g. "
                   "'{\"min_tokens\": 256, \"window\": 64}' for token_sparse")
    m.add_argument("--batch-size", type=int, default=8)
    e = parser.add_argument_group("endpoint (--endpoint)")
    e.add_argument("--api-model", default=None, help="the request's model field")
    e.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    e.add_argument("--api-key-env", default=None, metavar="NAME",
                   help="environment variable with the API key (default: no key is sent; "
                   "refused with plain http to another machine)")
    e.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="folder with the endpoint model's tokenizer.json: --lengths count "
                   "its tokens (default: bytes)")
    e.add_argument("--concurrency", type=int, default=4)
    e.add_argument("--timeout", type=float, default=60.0,
                   help="seconds per attempt in all (connect, send, every read)")
    e.add_argument("--max-reply-bytes", type=int, default=4 << 20,
                   help="the largest reply accepted, bytes (default 4 MiB)")
    e.add_argument("--retries", type=int, default=3)
    e.add_argument("--backoff", type=float, default=1.0, help="first retry wait, seconds")


def run(args: argparse.Namespace) -> int:
    """Runs ``lcjax eval``; returns the exit status."""
    if args.endpoint:
        try:
            target = EndpointConfig(args.endpoint, model=args.api_model, chat=args.chat,
                                    api_key_env=args.api_key_env or None,
                                    timeout=args.timeout, retries=args.retries,
                                    backoff=args.backoff, concurrency=args.concurrency,
                                    max_reply_bytes=args.max_reply_bytes)
        except ValueError as e:
            raise SystemExit(f"lcjax eval: {e}") from None
    else:
        target = args.model
    suite, options = suite_from_args(args)
    tokenizer = None
    if args.endpoint and args.tokenizer:
        tokenizer = HFTokenizer(args.tokenizer).encode
    results = evaluate(
        target, suite, args.lengths, args.depths, args.n_per_cell, args.seed,
        tasks=args.tasks, results_file=os.path.join(args.out, "results.jsonl"),
        resume=args.resume, retry_errors=args.retry_errors, batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens, attention=args.attention, progress=args.progress,
        attention_options=args.attention_options, tokenizer=tokenizer)
    command = command_line(["lcjax", "eval"], [
        ("--suite", args.suite), ("--model", args.model), ("--endpoint", args.endpoint),
        ("--api-model", args.api_model), ("--chat", args.chat or None),
        ("--lengths", args.lengths), ("--depths", args.depths),
        ("--n-per-cell", args.n_per_cell), ("--seed", args.seed), ("--tasks", args.tasks),
        *options, ("--attention", args.attention),
        ("--attention-options", None if args.attention_options is None
         else json.dumps(args.attention_options)),
        ("--tokenizer", args.tokenizer), ("--out", args.out)])
    write_report(results, args.out, command=command, machine=machine_info())
    printed = {"overall": results.summary["overall"], "out": args.out}
    if suite.report is not None:
        printed[suite.name] = suite.report(results.records, args.out)
    print(json.dumps(printed))
    failed = [r for r in results.records if r.get("error") is not None]
    if failed:
        kinds: dict[str, int] = {}
        for r in failed:
            kinds[str(r["error"])[:120]] = kinds.get(str(r["error"])[:120], 0) + 1
        lines = "\n".join(f"  {n} x {msg}" for msg, n in sorted(kinds.items(),
                                                                  key=lambda x: -x[1]))
        print(f"lcjax eval: {len(failed)} of {len(results.records)} items failed:\n{lines}",
              file=sys.stderr)
        if not args.allow_errors:
            return 1
    return 0


def suite_from_args(args: argparse.Namespace):
    """``(suite, [(flag, value)])``: the suite ``args.suite`` built with the suite flags
    given; a flag another suite declares is an error."""
    own = {o.dest: o for o in suite_options(args.suite)}
    given = {o.dest: o for o in suite_options() if getattr(args, o.dest, None) is not None}
    foreign = sorted(o.flag for d, o in given.items() if d not in own)
    if foreign:
        raise SystemExit(f"lcjax eval: suite {args.suite!r} takes no {', '.join(foreign)}")
    kwargs = {d: getattr(args, d) for d in given}
    try:
        suite = get_suite(args.suite, **kwargs)
    except ValueError as e:
        raise SystemExit(f"lcjax eval: {e}") from None
    return suite, [(own[d].flag, v) for d, v in kwargs.items()]


if __name__ == "__main__":  # python -m lcjax.eval.cli ...
    p = argparse.ArgumentParser(prog="lcjax eval")
    add_arguments(p)
    sys.exit(run(p.parse_args()))
