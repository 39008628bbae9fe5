"""`python -m attnkit <command> [flags]`: the attnkit CLI's commands, run in-process by the
extension (`python -m attnkit demo` is the same serving demo as `attnkit demo`)."""

import sys

from . import _attnkit as _C


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = dict(_C.cli_commands())
    if not argv or argv[0] in ("-h", "--help", "help"):
        out = sys.stdout if argv else sys.stderr
        print("usage: python -m attnkit <command> [flags]   (<command> --help for its flags)\n", file=out)
        print("commands:", file=out)
        for name in sorted(commands):
            print(f"  {name:<10} {commands[name]}", file=out)
        return 0 if argv else 2
    if argv[0] not in commands:
        print(f"attnkit: unknown command '{argv[0]}' (known: {', '.join(sorted(commands))})", file=sys.stderr)
        return 2
    sys.stdout.flush()
    return _C.run_cli(argv)


if __name__ == "__main__":
    sys.exit(main())
