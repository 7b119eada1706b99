"""The ``lcjax`` command: ``lcjax train``, ``lcjax bench``, ...

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; they are imported lazily so ``lcjax --help`` stays fast.

User errors end the command with one line on stderr and exit status 2, no traceback: the
argument parser's own (an unknown flag, a value outside ``choices``) and
:class:`lcjax.errors.UsageError`, which subcommands raise for what argparse cannot check
(a missing file, bad JSON, a folder that is not a run). Every other exception keeps its
traceback: it is a bug, or a failure whose traceback is the useful report.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from lcjax.errors import UsageError

# subcommand -> (module, help)
SUBCOMMANDS = {
    "train": ("lcjax.train.cli", "train a language model (config file or flags)"),
    "rl": ("lcjax.train.rl_cli", "GRPO with verifiable rewards: `lcjax rl --init RUN --items F`"),
    "bench": ("lcjax.bench.cli", "benchmarks: `lcjax bench attention`, ..."),
    "eval": ("lcjax.eval.cli", "long-context evaluation of a model folder or an endpoint"),
    "analyze": ("lcjax.analysis.cli", "static head analysis: `lcjax analyze lps --checkpoint DIR`"),
    "data": ("lcjax.data.cli", "dataset generation: `lcjax data tablelong --n N --out DIR`"),
    "compile": ("lcjax.compile_report", "compile a layer or training step for a TPU topology: "
                "`lcjax compile --model llama3-8b --topology v5p:2x2x2 --seq-len 131072`"),
    "serve": ("lcjax.serve.cli", "OpenAI-compatible HTTP server: `lcjax serve --checkpoint DIR`"),
    "variants": ("lcjax.nn.variants", "the registered attention variants and what each supports: "
                 "`lcjax variants --markdown`"),
}


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``PROG: error: MESSAGE (see PROG --help)``, exit 2);
    subparsers inherit the class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = _Parser(prog="lcjax", description=__doc__.splitlines()[0])
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
    try:
        return int(module.run(args) or 0)
    except UsageError as e:
        print(f"lcjax {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
