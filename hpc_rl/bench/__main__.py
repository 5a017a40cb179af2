import argparse
import contextlib
import json
import sys

from hpc_rl.bench import NAMES, load


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m hpc_rl.bench NAME [--json] [options]\nbenchmarks: {', '.join(NAMES)}")
        return 0
    name, rest = argv[0], argv[1:]
    module = load(name)
    parser = argparse.ArgumentParser(prog=f"python -m hpc_rl.bench {name}", description=module.__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    # stdout carries the figures alone (one JSON line with --json): what the code under test prints on the way (the
    # serial runner's progress lines) goes to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        result = module.run(args)
    if args.json:
        print(json.dumps(result))
    else:
        width = max(map(len, result), default=0)
        for key, value in result.items():
            print(f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
