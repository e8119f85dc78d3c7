"""`fewerbits bench train` twice in one process: with an inductor option as torch sets it, then on.

    PYTHONPATH=src python3 scripts/inductor_option.py coordinate_descent_tuning --json-dir DIR -- \
        --preset llama3-8b-8layers --batch-size 4 --seq-len 2048 --iters 10 --warmup 3 \
        --compile-blocks --compile-mode reduce-overhead --recipes bf16,fp8_tensorwise

The option (a boolean of `torch._inductor.config`, dotted names allowed) is set globally between
the two runs, so every compiled arm of the second run has it and none of the first; each run
compiles its arms afresh (a changed option is a new key for inductor's caches). The arguments
after `--` are `bench train`'s. With --json-dir the rows go to DIR/off.json and DIR/on.json.
"""

import argparse
import sys

import torch._inductor.config as inductor_config

from fewerbits.cli import main as cli


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    bench_args = argv[argv.index("--") + 1:] if "--" in argv else []
    ours = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("option", help="a boolean option of torch._inductor.config, e.g. coordinate_descent_tuning")
    p.add_argument("--json-dir", default=None)
    args = p.parse_args(ours)
    parent, _, name = args.option.rpartition(".")
    holder = inductor_config
    for part in filter(None, parent.split(".")):
        holder = getattr(holder, part)
    if not isinstance(getattr(holder, name, None), bool):
        raise SystemExit(f"torch._inductor.config.{args.option} is not a boolean option of this torch")
    for state in (getattr(holder, name), True):
        setattr(holder, name, state)
        print(f"=== torch._inductor.config.{args.option} = {state}", flush=True)
        json = ["--json", f"{args.json_dir}/{'on' if state else 'off'}.json"] if args.json_dir else []
        rc = cli(["bench", "train", *bench_args, *json])
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
