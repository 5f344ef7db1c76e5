"""``python -m capsnet``: the same as the ``capsnet`` command."""
import logging
import os
import sys

from . import distributed
from .cli import main

code = main()
if distributed.LEFT_A_GROUP:  # a torchrun rank that ran and left a process group: everything is written; end here,
    sys.stdout.flush()  # before gloo's teardown at interpreter exit can abort the finished run (distributed.py)
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
sys.exit(code)
