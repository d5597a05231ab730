"""Launching ranks: processes, temp folders, signals, the one wait loop, option checks.

- ``processes``: rank processes (``RankGroup``), temp folders removed on every exit path, launcher signals;
- ``watchdog``: a stdlib-only script that cleans up after a launcher killed with ``kill -9``;
- ``checks``: option checks shared by every command (numbers, input files, output paths);
- ``generate``: local ranks of ``zepp generate``.

Nothing here imports an executor: a launcher names the module its ranks run.
"""
