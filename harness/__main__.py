"""`python -m harness` and the `bench` command."""

import sys


def main() -> None:
    try:  # the imports take a moment: Ctrl-C then is a plain exit 130, not a traceback
        from harness.cli.app import app
    except KeyboardInterrupt:
        sys.stderr.write("interrupted while starting; nothing was run\n")
        sys.exit(130)
    app(prog_name="bench")


if __name__ == "__main__":
    main()
