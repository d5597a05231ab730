"""The one way the command-line tests run ``zepp`` in-process (imported as ``clirun``)."""

from __future__ import annotations

from zepp.cli import main


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``zepp ARGV`` (0 when it returns without ``SystemExit``)."""
    code = 0
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err
