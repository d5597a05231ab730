"""Launching ranks: where they run, processes, temp folders, signals, the one wait loop, option checks.

- ``ranks``: the one launch path of ``zepp run`` and ``zepp generate`` (local processes, torchrun,
  an emulated cluster handed in), ``RankRun`` (a run's temp folder, config and report);
- ``processes``: rank processes (``RankGroup`` and its wait-and-kill loop), temp folders removed on
  every exit path, how failures are reported (``RankFailure``);
- ``signals``: SIGTERM raised as ``Terminated`` in a launcher's main thread (``launcher_signals``);
- ``watchdog``: a stdlib-only script that cleans up after a launcher killed with ``kill -9``;
- ``checks``: option checks shared by every command (numbers, ranks, devices, faults, files).

Nothing here imports an executor: a launcher names the module its ranks run.
"""
