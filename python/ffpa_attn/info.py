"""python -m ffpa_attn.info: what this installation is and what it would run.

Prints the package's and the library's versions (and refuses, exit status 1,
when they differ), where the library was loaded from, its compiled
architectures and head dims, the GPU (and whether the library runs kernels on
it), and, for a shape given on the command line, what ffpa_attn_func would run
and why. Works without a GPU and without PyTorch (then it says so).

    python -m ffpa_attn.info [--shape B,Hq,Nq,D[,Nkv[,Hkv]]] [--dtype bf16|fp16] [--causal]
"""

from __future__ import annotations

import argparse
import sys

from . import __version__, _library


def _parse_shape(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(","))
    if not 4 <= len(values) <= 6:
        raise argparse.ArgumentTypeError("--shape takes B,Hq,Nq,D[,Nkv[,Hkv]]")
    return values


def report(args: argparse.Namespace) -> int:
    print(f"ffpa_attn {__version__}")
    try:
        library = _library.load_library()
    except _library.LibraryNotFoundError as error:
        print(f"library: not found\n{error}")
        return 1
    info = library.info
    print(f"library: {info.version} at {library.path}")
    if info.version != __version__:
        print(
            f"error: the library ({info.version}) and the package ({__version__}) differ; "
            "install them together (pip install of this package builds its library), "
            f"or point {_library.LIBRARY_ENV} at the library built with it",
            file=sys.stderr,
        )
        return 1
    print(
        f"  architectures: {', '.join(f'sm_{a}' for a in info.cuda_architectures) or 'none'};"
        f" head dims accepted: multiples of {info.head_dim_multiple} in [{info.min_head_dim}, {info.max_head_dim}]"
    )
    print(f"  sm80_split_d instances:  {', '.join(map(str, info.split_d_head_dims)) or 'none'}")
    print(f"  sm90_wgmma instances:    {', '.join(map(str, info.sm90_wgmma_head_dims)) or 'none'}")
    print(f"  sm90 FP8 instances:      {', '.join(map(str, info.sm90_fp8_head_dims)) or 'none'}")
    print(f"  sm90 backward instances: {', '.join(map(str, info.sm90_backward_head_dims)) or 'none'}")

    try:
        import torch
    except ModuleNotFoundError:
        print("torch: not installed (ffpa_attn_func needs it; the C library works without)")
        return 0
    print(f"torch: {torch.__version__}")
    if not torch.cuda.is_available():
        print("GPU: none visible to torch (ffpa_attn_func hands CUDA-less calls to SDPA)")
        return 0
    device = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(device)
    unsupported = library.device_support(device)
    verdict = "runs this build's kernels" if unsupported is None else f"no kernels here: {unsupported.message}"
    print(f"GPU {device}: {torch.cuda.get_device_name(device)} (sm_{major}{minor}): {verdict}")
    if args.shape:
        from .functional import explain

        b, hq, nq, d, *rest = args.shape
        nkv = rest[0] if rest else nq
        hkv = rest[1] if len(rest) > 1 else hq
        dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
        q = torch.empty(b, hq, nq, d, device="cuda", dtype=dtype)
        k = torch.empty(b, hkv, nkv, d, device="cuda", dtype=dtype)
        print(
            f"ffpa_attn_func on q [{b}, {hq}, {nq}, {d}], k/v [{b}, {hkv}, {nkv}, {d}] {args.dtype}"
            f"{' causal' if args.causal else ''}: "
            + explain(q, k, k, is_causal=args.causal, enable_gqa=hq != hkv)
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ffpa_attn.info", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=_parse_shape, help="B,Hq,Nq,D[,Nkv[,Hkv]]: say what a call of it would run")
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--version", action="version", version=f"ffpa_attn {__version__}")
    return report(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
