"""Command line for the engine: ``python -m engine info MODEL [--device auto] [--dtype auto] [--quantization L]
[--retune]``.

``info`` loads the model, prints what it is and where it runs, and, with ``--quantization`` (default "auto"), builds
the engine and prints which kernel each weight shape runs per batch bucket, with the timings behind the choice
(``engine/model/autotune.py``). ``--quantization off`` skips the engine (the loader's facts only). ``--retune``
first removes the kernel plans cached for this CPU (``engine/model/plan_cache.py``; say, ones measured while the
machine was busy), so this load measures them again.
"""

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
    info.add_argument(
        "--quantization",
        default="auto",
        help="level whose kernels to show: auto, bf16, int8, int4, ... or 'off'",
    )
    info.add_argument("--retune", action="store_true", help="remove this CPU's cached kernel plans first")
    return parser


def _retune() -> None:
    """Remove this CPU's cached kernel plans and say how many."""
    from engine.model.plan_cache import PlanCache
    from engine.system.hardware import detect

    cache = PlanCache()
    removed = cache.forget_machine()
    print(f"retune:       removed {removed} kernel plans for {detect().cpu_model} from {cache.path}")


def _kernels(model: str, device: str, dtype: str, level: str) -> None:
    """Build the engine at ``level`` and print the kernel plans its layers run."""
    from engine.core.llm import LLM
    from engine.model.kernel_timing import BUCKET_NAMES

    llm = LLM(
        model, device=device, dtype=dtype, quantization=level, start_loop=False, kv_cache_bytes=16 << 20
    )
    try:
        runner = llm.engine.runner
        print(f"level:        {llm.quantization} ({llm.weights_bytes / _GB:.2f} GB of weights in the engine)")
        if runner.weights_from_gguf:
            print(
                f"gguf blocks:  {runner.weights_from_gguf} fused weights run the file's own quantized blocks"
            )
        print(f"decode steps: {llm.decode_status}")
        if llm.quantization in ("int8", "int4") and runner.device.type == "cpu":
            from engine.model.vnni import vnni_problem

            problem = vnni_problem()
            print(f"vnni kernels: {'offered to the tuner' if problem is None else f'not offered: {problem}'}")
        if not runner.kernel_choices:
            print("kernels:      one per layer, not measured (fp32, CUDA, or HEARTH_AUTOTUNE=off)")
        for choice in runner.kernel_choices:
            plan = choice.plan
            rows = ", ".join(f"{b}: {k}" for b, k in zip(BUCKET_NAMES, plan.kernels, strict=True))
            source = "cached" if plan.cached else "measured"
            if plan.noise is not None:
                source += f", noise {plan.noise:.0%}{'' if plan.trusted else ', not cached'}"
            print(f"kernels:      {choice.role} {choice.shape[0]}x{choice.shape[1]}  rows {rows}  ({source})")
            print(f"              why: {plan.reason}")
            for name, times in plan.timings_us.items():
                print(f"              {name:<12} us per call by bucket: {', '.join(f'{t:g}' for t in times)}")
    finally:
        llm.close()


def _info(model: str, device: str, dtype: str, level: str = "auto", retune: bool = False) -> int:
    """Load ``model`` and print the facts about it (after removing this CPU's kernel plans, if ``retune``)."""
    from engine.loading.loader import load_model
    from engine.loading.validate import inspect_model

    if retune:
        _retune()
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
    del loaded
    if level.strip().lower() != "off":
        _kernels(model, device, dtype, level)
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
        return _info(args.model, args.device, args.dtype, args.quantization, args.retune)
    except (ModelLoadError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
