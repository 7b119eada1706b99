"""``lcjax analyze``: static analyses of a model checkpoint.

    lcjax analyze lps --checkpoint Llama-3.2-1B --top 20 --json lps.json
    lcjax analyze lps --checkpoint Qwen3-0.6B --enhance --out Qwen3-0.6B-enhanced

``lps`` scores every (layer, query head) of a Hugging Face Llama / Qwen2 / Qwen3
checkpoint directory (``lcjax.analysis.lps``; only W_Q and W_K are read), prints the top
heads, writes the table (``--json``: one record per head, 0-based ``layer`` and ``head``,
``lps``, ``s_dist``, ``s_erank``, ``sym``, ``score``) and a layer × head heat-map PNG, and
with ``--enhance`` writes the checkpoint with the top ``--enhance-heads`` heads' W_Q pairs
scaled by the multiplier schedule to ``--out`` (loadable by ``transformers``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from lcjax.analysis.lps import enhance_model, lps_scores
from lcjax.interop.hf import load_hf, read_hf_config, read_qk_weights, save_hf
from lcjax.rope import scaled_inv_freq


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``lcjax analyze`` subcommands to ``parser``."""
    sub = parser.add_subparsers(dest="analysis", required=True)
    p = sub.add_parser("lps", help="LPS long-context head scores of a HF checkpoint")
    p.add_argument("--checkpoint", required=True,
                   help="HF checkpoint directory (config.json + *.safetensors)")
    p.add_argument("--top", type=int, default=20, help="heads to print (default 20)")
    p.add_argument("--json", default=None, help="write all records to this JSON file")
    p.add_argument("--heatmap", default=None, help="heat-map PNG (default: beside --json, "
                   "else lps_heatmap.png)")
    p.add_argument("--distance", type=float, default=-32768,
                   help="relative distance n = j - i (default -32768)")
    p.add_argument("--sym-weight", type=float, default=0.5,
                   help="score = LPS - w * sym (default 0.5)")
    p.add_argument("--enhance", action="store_true",
                   help="write the checkpoint with the top heads enhanced to --out")
    p.add_argument("--out", default=None, help="output directory of --enhance")
    p.add_argument("--enhance-heads", type=int, default=10,
                   help="how many top heads to enhance (default 10)")
    p.add_argument("--multiplier", default=None,
                   help="'llama', 'qwen3' (64 pairs; default by model type) or a JSON file "
                   "with one number per RoPE pair")


def _multiplier(spec: str | None, model_type: str):
    if spec is None:
        return "qwen3" if model_type == "qwen3" else "llama"
    if spec in ("llama", "qwen3"):
        return spec
    with open(spec) as f:
        return json.load(f)


def run(args: argparse.Namespace) -> int:
    if args.analysis != "lps":
        raise ValueError(f"lcjax analyze: unknown analysis {args.analysis!r}")

    if args.enhance and not args.out:
        raise ValueError("lcjax analyze lps: --enhance needs --out DIR")
    if args.top < 0 or args.enhance_heads < 1:
        raise ValueError(f"lcjax analyze lps: --top must be >= 0 and --enhance-heads >= 1, "
                         f"got {args.top}, {args.enhance_heads}")
    start = time.perf_counter()
    config, wq, wk = read_qk_weights(args.checkpoint)
    read_s = time.perf_counter() - start
    result = lps_scores(wq, wk, frequencies=scaled_inv_freq(config.head_dim, config.rope_base,
                                                            config.rope_scaling),
                        distance=args.distance, layout=config.rope_layout,
                        sym_weight=args.sym_weight)
    del wq, wk
    score_s = time.perf_counter() - start - read_s
    print(f"{config.num_layers} layers x {config.num_heads} query heads "
          f"({config.num_kv_heads} key heads, head_dim {config.head_dim}); read "
          f"{read_s:.1f} s, scored {score_s:.1f} s")
    print(f"{'rank':>4} {'layer':>5} {'head':>4} {'score':>8} {'lps':>8} {'s_dist':>8} "
          f"{'s_erank':>8} {'sym':>8}")
    for rank, r in enumerate(result.top(args.top), 1):
        print(f"{rank:>4} {r['layer']:>5} {r['head']:>4} {r['score']:8.4f} {r['lps']:8.4f} "
              f"{r['s_dist']:8.4f} {r['s_erank']:8.4f} {r['sym']:8.4f}")
    if args.json:
        result.to_json(args.json)
        print(f"wrote {args.json}")
    heatmap = args.heatmap or (os.path.splitext(args.json)[0] + ".png" if args.json
                               else "lps_heatmap.png")
    result.heatmap(heatmap, top=min(args.top, 20),
                   title=f"LPS ranking score: {os.path.basename(os.path.abspath(args.checkpoint))}")
    print(f"wrote {heatmap}")
    if args.enhance:
        model_type = read_hf_config(args.checkpoint).get("model_type", "llama")
        heads = result.top_heads(args.enhance_heads)
        model, _ = load_hf(args.checkpoint)
        model = enhance_model(model, heads, _multiplier(args.multiplier, model_type))
        save_hf(model, args.out, like=args.checkpoint)
        print(f"enhanced {len(heads)} heads {heads}; wrote {args.out}")
    return 0


def main(argv=None) -> int:  # pragma: no cover - `lcjax analyze` is the entry point
    parser = argparse.ArgumentParser(prog="lcjax analyze")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
