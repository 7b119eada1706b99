"""The ``lcjax`` command: ``lcjax train``, ``lcjax bench``, ...

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; they are imported lazily so ``lcjax --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, help)
SUBCOMMANDS = {
    "train": ("lcjax.train.cli", "train a language model (config file or flags)"),
    "rl": ("lcjax.train.rl_cli", "GRPO with verifiable rewards: `lcjax rl --init RUN --items F`"),
    "bench": ("lcjax.bench.cli", "benchmarks: `lcjax bench attention`, `lcjax bench entmax`"),
    "eval": ("lcjax.eval.cli", "long-context evaluation of a model folder or an endpoint"),
    "analyze": ("lcjax.analysis.cli", "static head analysis: `lcjax analyze lps --checkpoint DIR`"),
    "data": ("lcjax.data.cli", "dataset generation: `lcjax data tablelong --n N --out DIR`"),
    "compile": ("lcjax.compile_report", "compile a layer or training step for a TPU topology: "
                "`lcjax compile --model llama3-8b --topology v5p:2x2x2 --seq-len 131072`"),
    "serve": ("lcjax.serve.cli", "OpenAI-compatible HTTP server: `lcjax serve --checkpoint DIR`"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lcjax", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    wanted = argv[0] if argv else None
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == wanted:  # import only the module that will run
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
