"""Command line for the engine: ``python -m engine info MODEL [--device auto] [--dtype auto]``."""

from __future__ import annotations

import argparse
import sys

from engine.api import ModelLoadError

_GB = 1e9


def _parser() -> argparse.ArgumentParser:
    """Build the argument parser."""
    parser = argparse.ArgumentParser(prog="python -m engine", description="Hearth inference engine tools.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = commands.add_parser("info", help="load a model and print what it is and where it runs")
    info.add_argument("model", help="'default', a Hugging Face model folder, or a .gguf file")
    info.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    info.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16 (default: auto)")
    return parser


def _info(model: str, device: str, dtype: str) -> int:
    """Load ``model`` and print the facts about it."""
    from engine.loading.loader import load_model
    from engine.loading.validate import inspect_model

    info = inspect_model(model)
    loaded = load_model(model, device=device, dtype=dtype)
    print(f"model:        {loaded.path}")
    print(
        f"architecture: {info.architecture} ({info.model_type}, stored as {info.format} {info.stored_dtype})"
    )
    print(f"parameters:   {loaded.num_parameters:,}")
    print(f"dtype:        {str(loaded.dtype).removeprefix('torch.')}")
    print(f"device:       {loaded.device} ({loaded.device_reason})")
    print(f"in memory:    {loaded.weights_bytes:,} bytes ({loaded.weights_bytes / _GB:.2f} GB)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when omitted.

    Returns:
        The exit status: 0 on success, 2 on a usage error or when the model cannot be loaded.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command != "info":
        parser.print_usage(sys.stderr)
        return 2
    try:
        return _info(args.model, args.device, args.dtype)
    except (ModelLoadError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
