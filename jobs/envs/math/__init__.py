"""The `math` env family: word problems (problems.py, shipped as problems.jsonl) solved by
running Python cells (env.py) in a sandbox (sandbox.py, with _sandbox_runner.py as the sandboxed
interpreter's prelude)."""
