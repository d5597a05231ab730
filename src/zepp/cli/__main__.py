"""``python -m zepp.cli ...`` (the form ``torchrun -m zepp.cli run ...`` uses)."""

from zepp.cli import main

main()
