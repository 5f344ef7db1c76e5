"""``python -m capsnet``: the same as the ``capsnet`` command."""
import sys

from .cli import main

sys.exit(main())
