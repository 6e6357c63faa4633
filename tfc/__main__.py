"""Run the command line as `python -m tfc`."""

from tfc.cli import main

main()
