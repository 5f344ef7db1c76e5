"""``python -m capsnet``: the same as the ``capsnet`` command."""
from . import distributed
from .cli import main

# a torchrun rank that ran and left a process group ends by os._exit, everything written, before gloo's teardown at
# interpreter exit can abort the finished run (distributed.exit_process)
distributed.exit_process(main())
