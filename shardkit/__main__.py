"""``python -m shardkit`` is the ``shardkit`` command; :func:`run` is also the console script's entry point."""

import sys


def run() -> None:
    """The ``shardkit`` command. A bare ``--version`` is answered before click and the commands are imported
    (what a start-up check or a wrapper script calls most); anything else goes to :func:`shardkit.cli.main`."""
    if sys.argv[1:] == ["--version"]:
        from ._version import __version__

        try:
            sys.stdout.write(f"shardkit, version {__version__}\n")  # click's version_option words it the same
            sys.stdout.flush()
        except BrokenPipeError:  # the reader went away (| head -0): not an error; nothing left to flush at exit
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    from .cli import main

    main()


if __name__ == "__main__":
    run()
