"""``python -m capsnet``: the same as the ``capsnet`` command."""
import sys

try:
    from . import cli, distributed
except KeyboardInterrupt:  # Ctrl-C while torch loads: one line, as the command says it (capsnet._entry)
    print("capsnet: interrupted while starting", file=sys.stderr)
    sys.exit(130)

# a torchrun rank that ran and left a process group ends by os._exit, everything written, before gloo's teardown at
# interpreter exit can abort the finished run (distributed.exit_process)
cli.AS_PROGRAM = True
distributed.exit_process(cli.main())
