"""The light install: the core (pyproject's ``dependencies``) is enough for the attention
functions and the model; every other third-party package is an extra, and importing a module
that needs a missing extra raises a one-line ImportError naming it (lcjax.optional.require).

The extras' packages are hidden from a fresh interpreter by a ``sys.meta_path`` finder, so
the test runs in the full dev environment.
"""

import json
import os
import subprocess
import sys
import tomllib

import pytest

from lcjax.optional import EXTRAS, require

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# every top-level module an extra provides (and the big ones they pull), listed here rather
# than read from lcjax.optional, so a package moved to the core by mistake shows up here
BLOCKED = ("fastapi", "uvicorn", "starlette", "pydantic", "jinja2", "faker", "sentencex",
           "statsmodels", "pandas", "matplotlib", "tokenizers", "requests", "httpx",
           "transformers", "torch", "safetensors", "threadpoolctl", "entmax")

PROBE = r"""
import importlib, importlib.abc, json, sys
BLOCKED = set(sys.argv[1].split(","))

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None

sys.meta_path.insert(0, Block())
out = {}
for mod in sys.argv[2:]:
    try:
        importlib.import_module(mod)
        out[mod] = None
    except ImportError as err:
        out[mod] = f"{type(err).__name__}: {err}"
out["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(json.dumps(out))
"""

# module -> the extra its ImportError must name
NEEDS = {"lcjax.serve.app": "serve", "lcjax.data.parallel": "data",
         "lcjax.eval.http_client": "eval", "lcjax.analysis.lps": "eval"}


def _probe(*modules: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-c", PROBE, ",".join(BLOCKED), *modules],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probed():
    return _probe("lcjax.attention", "lcjax.nn", *NEEDS)


def test_core_dependencies_are_the_design_cards():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    names = {d.split(">")[0].split("=")[0].split("[")[0].strip()
             for d in project["dependencies"]}
    assert names == {"jax", "flax", "optax", "orbax-checkpoint", "chex", "grain", "numpy",
                     "jaxtyping", "tqdm"}
    extras = project["optional-dependencies"]
    assert {"serve", "data", "eval", "experiments", "hf", "gpu", "tpu", "dev"} <= set(extras)
    assert set(EXTRAS) <= set(extras)


def test_attention_imports_without_extras(probed):
    assert probed["lcjax.attention"] is None


def test_nn_imports_without_extras(probed):
    assert probed["lcjax.nn"] is None


@pytest.mark.parametrize("module", sorted(NEEDS))
def test_missing_extra_is_one_line_naming_it(probed, module):
    message = probed[module]
    extra = NEEDS[module]
    assert message is not None, f"{module} imported with the {extra} extra hidden"
    assert message.startswith("ImportError: ") and "\n" not in message
    assert f"pip install 'lcjax[{extra}]'" in message and " needs " in message


def test_require_names_the_missing_module_and_extra():
    with pytest.raises(ImportError, match=r"^lcjax\.x needs no_such_pkg_7f3: pip install "
                                          r"'lcjax\[data\]'$"):
        with require("data", "lcjax.x"):
            import no_such_pkg_7f3  # noqa: F401


def test_require_lets_our_own_missing_modules_through():
    # a missing lcjax module is a bug, not a missing extra: the original error propagates
    with pytest.raises(ModuleNotFoundError, match="lcjax.no_such_module"):
        with require("data", "lcjax.x"):
            import lcjax.no_such_module  # noqa: F401


def test_require_refuses_an_unknown_extra():
    with pytest.raises(ValueError, match="unknown extra 'servr'"):
        with require("servr", "lcjax.x"):
            pass
