"""save_hf of a byte-level model writes its tokenizer (issue 36 item 8): tokenizer.json (a
`tokenizers` model whose ids are lcjax's byte ids), tokenizer_config.json, and the bos/eos/pad
ids in config.json and generation_config.json; with `transformers` installed (the `hf` extra)
the export loads there and greedy generation gives the same text as lcjax's."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tokenizers import Tokenizer

from lcjax.data import tokenizer as byte_tok
from lcjax.interop.hf import load_hf, save_hf
from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.nn.sampling import generate

CFG = DecoderConfig(vocab_size=byte_tok.VOCAB_SIZE, d_model=32, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, mlp_hidden=64, max_len=64)
TEXTS = ["Hello, world!", "  leading spaces\tand tabs\n", "héllo ✓ 日本語 😀", "\x00\x7f\xff"]


def _model():
    model = DecoderLM(CFG, rngs=nnx.Rngs(1))
    # random weights large enough that greedy decoding is not a constant
    for path, leaf in nnx.iter_graph(model):
        if isinstance(leaf, nnx.Param) and leaf[...].ndim >= 2:
            rng = np.random.default_rng(len(path))
            leaf[...] = jnp.asarray(rng.normal(size=leaf[...].shape) * 0.3, leaf[...].dtype)
    return model


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    path = tmp_path_factory.mktemp("export")
    model = _model()
    save_hf(model, path)
    return model, str(path)


def test_tokenizer_ids_are_lcjax_byte_ids(export):
    _, path = export
    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    for text in TEXTS:
        enc = tok.encode(text)
        np.testing.assert_array_equal(enc.ids, byte_tok.encode(text, bos=True))
        assert tok.decode(enc.ids) == text
    assert tok.decode([byte_tok.BOS, *byte_tok.encode("ab"), byte_tok.EOS],
                      skip_special_tokens=False) == "<bos>ab<eos>"
    assert tok.get_vocab_size() == byte_tok.VOCAB_SIZE
    invalid = tok.decode([0xC3])  # a lone UTF-8 lead byte decodes with a replacement char
    assert invalid == "\ufffd"


def test_config_token_ids_and_generation_config(export):
    model, path = export
    hf = json.load(open(os.path.join(path, "config.json")))
    gen = json.load(open(os.path.join(path, "generation_config.json")))
    tok_cfg = json.load(open(os.path.join(path, "tokenizer_config.json")))
    want = {"bos_token_id": byte_tok.BOS, "eos_token_id": byte_tok.EOS,
            "pad_token_id": byte_tok.PAD}
    assert {k: hf[k] for k in want} == want and gen == want
    assert (tok_cfg["bos_token"], tok_cfg["eos_token"], tok_cfg["pad_token"]) == (
        "<bos>", "<eos>", "<pad>")
    loaded, _ = load_hf(path)  # the weights still load
    x = jnp.asarray([byte_tok.encode("abc", bos=True)])
    np.testing.assert_allclose(np.asarray(loaded(x)), np.asarray(model(x)), rtol=1e-6,
                               atol=1e-6)


def test_small_vocabulary_writes_no_tokenizer(tmp_path):
    small = DecoderLM(DecoderConfig(vocab_size=32, d_model=16, num_layers=1, num_heads=2,
                                    num_kv_heads=1, head_dim=8, mlp_hidden=16, max_len=16),
                      rngs=nnx.Rngs(0))
    with pytest.warns(UserWarning, match="no tokenizer written"):
        save_hf(small, tmp_path / "a")
    assert not os.path.exists(tmp_path / "a" / "tokenizer.json")
    with pytest.raises(ValueError, match="vocab_size >= 259"):
        save_hf(small, tmp_path / "b", tokenizer="bytes")


def test_transformers_loads_the_export_and_generates_the_same_text(export):
    transformers = pytest.importorskip(
        "transformers",
        reason="needs transformers (the `hf-peer` extra: pip install 'lcjax[hf-peer]')")
    torch = pytest.importorskip("torch", reason="needs torch (the `hf-peer` extra)")
    model, path = export
    tok = transformers.AutoTokenizer.from_pretrained(path)
    peer = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    prompt = "The quick brown fox"
    ids = tok(prompt, return_tensors="pt").input_ids
    np.testing.assert_array_equal(ids[0].numpy(), byte_tok.encode(prompt, bos=True))
    assert (tok.bos_token_id, tok.eos_token_id) == (byte_tok.BOS, byte_tok.EOS)
    out = peer.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None,
                        pad_token_id=byte_tok.PAD)
    ours = generate(model, jnp.asarray(ids.numpy()), max_new_tokens=12).tokens
    np.testing.assert_array_equal(out[0].numpy(), np.asarray(ours[0]))
    assert tok.decode(out[0], skip_special_tokens=True) == byte_tok.decode(
        np.asarray(ours[0][1:]))
