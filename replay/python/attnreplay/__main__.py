"""python -m attnreplay: the same command line as attnreplay-py (cli.py)."""
import sys

from .cli import main

sys.exit(main())
